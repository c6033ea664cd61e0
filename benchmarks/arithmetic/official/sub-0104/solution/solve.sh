#!/bin/bash
# Oracle (56 - 25 = 31).
echo 31 > /app/answer.txt
