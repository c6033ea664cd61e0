#!/bin/bash
# Oracle (96 - 34 = 62).
echo 62 > /app/answer.txt
