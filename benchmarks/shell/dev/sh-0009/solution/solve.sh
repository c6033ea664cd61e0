#!/bin/bash
# Oracle (harbor -> meadow).
sed -i 's/harbor/meadow/g' /app/message.txt
