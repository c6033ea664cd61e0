#!/bin/bash
# Oracle (82 - 47 = 35).
echo 35 > /app/answer.txt
