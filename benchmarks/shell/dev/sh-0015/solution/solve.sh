#!/bin/bash
# Oracle (column city).
tail -n +2 /app/people.csv | cut -d, -f1 > /app/column.txt
