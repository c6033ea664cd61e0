#!/bin/bash
# Oracle (35 - 34 = 1).
echo 1 > /app/answer.txt
