#!/bin/bash
# Oracle (72 - 55 = 17).
echo 17 > /app/answer.txt
