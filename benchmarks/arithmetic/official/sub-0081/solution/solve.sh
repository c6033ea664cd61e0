#!/bin/bash
# Oracle (82 - 28 = 54).
echo 54 > /app/answer.txt
