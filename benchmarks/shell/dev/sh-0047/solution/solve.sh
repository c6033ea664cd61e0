#!/bin/bash
# Oracle (create /app/reports/rupert.txt).
mkdir -p /app/reports
printf '%s\n' 'cloud=222' 'orbit=930' 'wolf=310' > /app/reports/rupert.txt
