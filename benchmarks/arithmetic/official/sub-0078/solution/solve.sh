#!/bin/bash
# Oracle (23 - 11 = 12).
echo 12 > /app/answer.txt
