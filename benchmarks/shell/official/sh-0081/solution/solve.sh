#!/bin/bash
# Oracle (6 ERROR lines).
awk '$2 == "ERROR"' /app/app.log | wc -l > /app/answer.txt
