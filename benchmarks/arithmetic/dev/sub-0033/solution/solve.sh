#!/bin/bash
# Oracle (82 - 40 = 42).
echo 42 > /app/answer.txt
