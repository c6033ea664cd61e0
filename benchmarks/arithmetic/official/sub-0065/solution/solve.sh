#!/bin/bash
# Oracle (19 - 16 = 3).
echo 3 > /app/answer.txt
