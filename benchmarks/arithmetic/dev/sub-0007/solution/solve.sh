#!/bin/bash
# Oracle (51 - 17 = 34).
echo 34 > /app/answer.txt
