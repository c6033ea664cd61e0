#!/bin/bash
# Oracle (49 - 31 = 18).
echo 18 > /app/answer.txt
