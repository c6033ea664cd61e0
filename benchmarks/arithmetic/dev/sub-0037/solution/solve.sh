#!/bin/bash
# Oracle (93 - 23 = 70).
echo 70 > /app/answer.txt
