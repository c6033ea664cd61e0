#!/bin/bash
# Oracle (94 - 54 = 40).
echo 40 > /app/answer.txt
