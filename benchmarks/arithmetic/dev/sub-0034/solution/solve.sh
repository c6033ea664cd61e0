#!/bin/bash
# Oracle (94 - 29 = 65).
echo 65 > /app/answer.txt
