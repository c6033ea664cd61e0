#!/bin/bash
# Oracle (44 - 28 = 16).
echo 16 > /app/answer.txt
