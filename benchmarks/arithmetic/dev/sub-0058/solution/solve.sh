#!/bin/bash
# Oracle (75 - 22 = 53).
echo 53 > /app/answer.txt
