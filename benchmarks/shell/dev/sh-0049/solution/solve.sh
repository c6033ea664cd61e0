#!/bin/bash
# Oracle (pixel -> nebula).
sed -i 's/pixel/nebula/g' /app/message.txt
