#!/bin/bash
# Oracle (cloud -> nebula).
sed -i 's/cloud/nebula/g' /app/message.txt
