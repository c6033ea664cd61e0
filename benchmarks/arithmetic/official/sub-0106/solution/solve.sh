#!/bin/bash
# Oracle (64 - 11 = 53).
echo 53 > /app/answer.txt
