#!/bin/bash
# Oracle (smallest = 135).
sort -n /app/numbers.txt | head -n 1 > /app/answer.txt
