#!/bin/bash
# Oracle (42 - 19 = 23).
echo 23 > /app/answer.txt
