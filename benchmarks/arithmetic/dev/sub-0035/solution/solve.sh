#!/bin/bash
# Oracle (97 - 38 = 59).
echo 59 > /app/answer.txt
