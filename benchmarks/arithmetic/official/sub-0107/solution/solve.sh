#!/bin/bash
# Oracle (56 - 36 = 20).
echo 20 > /app/answer.txt
