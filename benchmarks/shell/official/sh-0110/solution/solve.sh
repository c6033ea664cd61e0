#!/bin/bash
# Oracle (largest = 8519).
sort -n /app/numbers.txt | tail -n 1 > /app/answer.txt
