#!/bin/bash
# Oracle (66 - 16 = 50).
echo 50 > /app/answer.txt
