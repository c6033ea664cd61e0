#!/bin/bash
# Oracle (14 - 10 = 4).
echo 4 > /app/answer.txt
