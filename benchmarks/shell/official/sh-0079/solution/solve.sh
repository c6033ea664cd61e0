#!/bin/bash
# Oracle (moss -> willow).
sed -i 's/moss/willow/g' /app/message.txt
