#!/bin/bash
# Oracle (93 - 88 = 5).
echo 5 > /app/answer.txt
