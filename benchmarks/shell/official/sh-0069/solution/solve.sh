#!/bin/bash
# Oracle (wolf -> nebula).
sed -i 's/wolf/nebula/g' /app/message.txt
