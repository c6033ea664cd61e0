#!/bin/bash
# Oracle (80 - 13 = 67).
echo 67 > /app/answer.txt
