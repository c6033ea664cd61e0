#!/bin/bash
# Oracle (44 - 43 = 1).
echo 1 > /app/answer.txt
