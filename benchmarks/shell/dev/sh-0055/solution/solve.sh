#!/bin/bash
# Oracle (column name).
tail -n +2 /app/people.csv | cut -d, -f3 > /app/column.txt
