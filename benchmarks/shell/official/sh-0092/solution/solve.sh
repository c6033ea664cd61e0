#!/bin/bash
# Oracle (tiger occurs 9 times).
grep -ow 'tiger' /app/text.txt | wc -l > /app/answer.txt
