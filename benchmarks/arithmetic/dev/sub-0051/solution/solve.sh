#!/bin/bash
# Oracle (54 - 13 = 41).
echo 41 > /app/answer.txt
