#!/bin/bash
# Oracle (95 - 10 = 85).
echo 85 > /app/answer.txt
