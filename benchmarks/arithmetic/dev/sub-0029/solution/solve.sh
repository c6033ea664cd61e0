#!/bin/bash
# Oracle (31 - 16 = 15).
echo 15 > /app/answer.txt
