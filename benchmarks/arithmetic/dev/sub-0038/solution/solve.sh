#!/bin/bash
# Oracle (33 - 29 = 4).
echo 4 > /app/answer.txt
