#!/bin/bash
# Oracle (cloud occurs 9 times).
grep -ow 'cloud' /app/text.txt | wc -l > /app/answer.txt
