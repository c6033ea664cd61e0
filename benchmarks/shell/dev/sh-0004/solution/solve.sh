#!/bin/bash
# Oracle (grape x5).
sort /app/items.txt | uniq -c | sort -rn | head -n 1 | awk '{print $2}' > /app/answer.txt
