#!/bin/bash
# Oracle (75 - 17 = 58).
echo 58 > /app/answer.txt
