#!/bin/bash
# Oracle (smallest = 102).
sort -n /app/numbers.txt | head -n 1 > /app/answer.txt
