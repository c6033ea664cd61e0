#!/bin/bash
# Oracle (bright occurs 9 times).
grep -ow 'bright' /app/text.txt | wc -l > /app/answer.txt
