#!/bin/bash
# Oracle (column team).
tail -n +2 /app/people.csv | cut -d, -f1 > /app/column.txt
