#!/bin/bash
# Oracle (64 - 41 = 23).
echo 23 > /app/answer.txt
