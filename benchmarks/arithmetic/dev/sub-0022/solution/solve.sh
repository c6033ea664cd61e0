#!/bin/bash
# Oracle (75 - 63 = 12).
echo 12 > /app/answer.txt
