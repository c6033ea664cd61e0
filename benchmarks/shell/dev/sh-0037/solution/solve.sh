#!/bin/bash
# Oracle (create /app/out/bob.txt).
mkdir -p /app/out
printf '%s\n' 'quill=979' 'harbor=397' 'stone=295' 'orbit=332' > /app/out/bob.txt
