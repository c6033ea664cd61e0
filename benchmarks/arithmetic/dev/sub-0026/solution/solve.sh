#!/bin/bash
# Oracle (32 - 17 = 15).
echo 15 > /app/answer.txt
