#!/bin/bash
# Oracle (78 - 27 = 51).
echo 51 > /app/answer.txt
