#!/bin/bash
# Oracle (lotus -> willow).
sed -i 's/lotus/willow/g' /app/message.txt
