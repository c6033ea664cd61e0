#!/bin/bash
# Oracle (62 - 60 = 2).
echo 2 > /app/answer.txt
