#!/bin/bash
# Oracle (94 - 62 = 32).
echo 32 > /app/answer.txt
