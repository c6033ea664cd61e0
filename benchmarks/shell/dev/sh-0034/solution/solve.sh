#!/bin/bash
# Oracle (banana x6).
sort /app/items.txt | uniq -c | sort -rn | head -n 1 | awk '{print $2}' > /app/answer.txt
