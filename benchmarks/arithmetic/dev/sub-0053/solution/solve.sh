#!/bin/bash
# Oracle (36 - 34 = 2).
echo 2 > /app/answer.txt
