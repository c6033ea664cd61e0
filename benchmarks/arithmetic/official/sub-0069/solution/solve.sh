#!/bin/bash
# Oracle (56 - 20 = 36).
echo 36 > /app/answer.txt
