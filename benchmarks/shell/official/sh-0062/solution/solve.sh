#!/bin/bash
# Oracle (lotus occurs 7 times).
grep -ow 'lotus' /app/text.txt | wc -l > /app/answer.txt
