#!/bin/bash
# Oracle (pixel occurs 8 times).
grep -ow 'pixel' /app/text.txt | wc -l > /app/answer.txt
