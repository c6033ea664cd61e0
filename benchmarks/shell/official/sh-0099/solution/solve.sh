#!/bin/bash
# Oracle (sand -> falcon).
sed -i 's/sand/falcon/g' /app/message.txt
