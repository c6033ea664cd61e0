#!/bin/bash
# Oracle (create /app/docs/dave.txt).
mkdir -p /app/docs
printf '%s\n' 'wolf=946' 'ember=3' 'maple=590' > /app/docs/dave.txt
