#!/bin/bash
# Oracle (create /app/reports/bob.txt).
mkdir -p /app/reports
printf '%s\n' 'river=761' 'wolf=458' 'wolf=362' 'bright=938' > /app/reports/bob.txt
