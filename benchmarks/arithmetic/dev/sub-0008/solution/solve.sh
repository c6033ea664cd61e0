#!/bin/bash
# Oracle (61 - 30 = 31).
echo 31 > /app/answer.txt
