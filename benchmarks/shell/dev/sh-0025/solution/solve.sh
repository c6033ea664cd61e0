#!/bin/bash
# Oracle (column name).
tail -n +2 /app/people.csv | cut -d, -f4 > /app/column.txt
