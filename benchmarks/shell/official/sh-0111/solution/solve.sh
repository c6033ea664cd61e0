#!/bin/bash
# Oracle (8 WARN lines).
awk '$2 == "WARN"' /app/app.log | wc -l > /app/answer.txt
