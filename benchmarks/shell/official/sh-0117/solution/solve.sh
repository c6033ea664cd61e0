#!/bin/bash
# Oracle (create /app/reports/oscar.txt).
mkdir -p /app/reports
printf '%s\n' 'maple=289' 'quill=803' 'cloud=367' > /app/reports/oscar.txt
