#!/bin/bash
# Oracle (sand -> glacier).
sed -i 's/sand/glacier/g' /app/message.txt
