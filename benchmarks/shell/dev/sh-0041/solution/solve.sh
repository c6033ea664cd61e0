#!/bin/bash
# Oracle (5 ERROR lines).
awk '$2 == "ERROR"' /app/app.log | wc -l > /app/answer.txt
