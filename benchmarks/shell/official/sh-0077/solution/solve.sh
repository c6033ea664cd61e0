#!/bin/bash
# Oracle (create /app/out/victor.txt).
mkdir -p /app/out
printf '%s\n' 'stone=26' 'lotus=217' 'bright=24' > /app/out/victor.txt
