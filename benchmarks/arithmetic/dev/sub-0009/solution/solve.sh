#!/bin/bash
# Oracle (96 - 12 = 84).
echo 84 > /app/answer.txt
