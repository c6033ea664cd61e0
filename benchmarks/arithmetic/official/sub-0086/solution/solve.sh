#!/bin/bash
# Oracle (62 - 31 = 31).
echo 31 > /app/answer.txt
