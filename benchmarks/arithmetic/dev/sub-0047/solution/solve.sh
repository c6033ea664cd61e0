#!/bin/bash
# Oracle (37 - 29 = 8).
echo 8 > /app/answer.txt
