#!/bin/bash
# Oracle (river occurs 11 times).
grep -ow 'river' /app/text.txt | wc -l > /app/answer.txt
