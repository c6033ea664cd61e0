#!/bin/bash
# Oracle (pixel occurs 15 times).
grep -ow 'pixel' /app/text.txt | wc -l > /app/answer.txt
