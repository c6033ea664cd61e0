#!/bin/bash
# Oracle (97 - 26 = 71).
echo 71 > /app/answer.txt
