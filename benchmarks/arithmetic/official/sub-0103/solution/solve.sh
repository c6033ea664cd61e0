#!/bin/bash
# Oracle (72 - 44 = 28).
echo 28 > /app/answer.txt
