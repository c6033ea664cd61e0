#!/bin/bash
# Oracle (64 - 53 = 11).
echo 11 > /app/answer.txt
