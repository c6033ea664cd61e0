#!/bin/bash
# Oracle (create /app/docs/heidi.txt).
mkdir -p /app/docs
printf '%s\n' 'sand=833' 'lotus=874' > /app/docs/heidi.txt
