#!/bin/bash
# Oracle (harbor -> falcon).
sed -i 's/harbor/falcon/g' /app/message.txt
