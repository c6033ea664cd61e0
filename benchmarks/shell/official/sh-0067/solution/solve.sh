#!/bin/bash
# Oracle (create /app/out/frank.txt).
mkdir -p /app/out
printf '%s\n' 'cloud=551' 'lotus=172' 'frost=478' 'ember=851' > /app/out/frank.txt
