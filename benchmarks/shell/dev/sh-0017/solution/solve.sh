#!/bin/bash
# Oracle (create /app/reports/nina.txt).
mkdir -p /app/reports
printf '%s\n' 'frost=68' 'tiger=508' 'moss=246' > /app/reports/nina.txt
