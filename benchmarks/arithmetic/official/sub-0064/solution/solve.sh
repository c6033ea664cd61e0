#!/bin/bash
# Oracle (62 - 17 = 45).
echo 45 > /app/answer.txt
