#!/bin/bash
# Oracle (58 - 47 = 11).
echo 11 > /app/answer.txt
