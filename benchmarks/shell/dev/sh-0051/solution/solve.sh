#!/bin/bash
# Oracle (5 WARN lines).
awk '$2 == "WARN"' /app/app.log | wc -l > /app/answer.txt
