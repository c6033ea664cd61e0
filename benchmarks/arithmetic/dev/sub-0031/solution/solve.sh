#!/bin/bash
# Oracle (31 - 29 = 2).
echo 2 > /app/answer.txt
