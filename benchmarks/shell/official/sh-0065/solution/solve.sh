#!/bin/bash
# Oracle (column city).
tail -n +2 /app/people.csv | cut -d, -f2 > /app/column.txt
