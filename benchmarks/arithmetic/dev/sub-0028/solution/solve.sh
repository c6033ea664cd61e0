#!/bin/bash
# Oracle (61 - 38 = 23).
echo 23 > /app/answer.txt
