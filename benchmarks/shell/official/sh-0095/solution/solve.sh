#!/bin/bash
# Oracle (column team).
tail -n +2 /app/people.csv | cut -d, -f4 > /app/column.txt
