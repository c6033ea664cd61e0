#!/bin/bash
# Oracle (97 - 71 = 26).
echo 26 > /app/answer.txt
