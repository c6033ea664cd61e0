#!/bin/bash
# Oracle (97 - 78 = 19).
echo 19 > /app/answer.txt
