#!/bin/bash
# Oracle (94 - 34 = 60).
echo 60 > /app/answer.txt
