#!/bin/bash
# Oracle (smallest = 730).
sort -n /app/numbers.txt | head -n 1 > /app/answer.txt
