#!/bin/bash
# Oracle (largest = 9508).
sort -n /app/numbers.txt | tail -n 1 > /app/answer.txt
