#!/bin/bash
# Oracle (15 - 13 = 2).
echo 2 > /app/answer.txt
