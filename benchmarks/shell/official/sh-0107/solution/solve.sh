#!/bin/bash
# Oracle (create /app/drafts/bob.txt).
mkdir -p /app/drafts
printf '%s\n' 'stone=935' 'tiger=18' > /app/drafts/bob.txt
