#!/bin/bash
# Oracle (7 ERROR lines).
awk '$2 == "ERROR"' /app/app.log | wc -l > /app/answer.txt
