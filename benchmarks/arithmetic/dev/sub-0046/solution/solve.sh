#!/bin/bash
# Oracle (68 - 23 = 45).
echo 45 > /app/answer.txt
