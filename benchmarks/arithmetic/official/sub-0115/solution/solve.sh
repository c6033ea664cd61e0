#!/bin/bash
# Oracle (56 - 44 = 12).
echo 12 > /app/answer.txt
