#!/bin/bash
# Oracle (81 - 78 = 3).
echo 3 > /app/answer.txt
