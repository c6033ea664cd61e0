#!/bin/bash
# Oracle (create /app/drafts/rupert.txt).
mkdir -p /app/drafts
printf '%s\n' 'cloud=89' 'bright=253' 'lotus=126' 'orbit=439' > /app/drafts/rupert.txt
