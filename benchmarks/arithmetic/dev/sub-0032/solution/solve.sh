#!/bin/bash
# Oracle (74 - 31 = 43).
echo 43 > /app/answer.txt
