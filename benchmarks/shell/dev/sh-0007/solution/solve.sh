#!/bin/bash
# Oracle (create /app/docs/mallory.txt).
mkdir -p /app/docs
printf '%s\n' 'lotus=454' 'ember=140' 'river=672' 'moss=33' > /app/docs/mallory.txt
