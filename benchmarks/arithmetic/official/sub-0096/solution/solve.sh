#!/bin/bash
# Oracle (64 - 31 = 33).
echo 33 > /app/answer.txt
