#!/bin/bash
# Oracle (10 WARN lines).
awk '$2 == "WARN"' /app/app.log | wc -l > /app/answer.txt
