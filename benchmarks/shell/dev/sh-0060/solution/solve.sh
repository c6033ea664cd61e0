#!/bin/bash
# Oracle (smallest = 452).
sort -n /app/numbers.txt | head -n 1 > /app/answer.txt
