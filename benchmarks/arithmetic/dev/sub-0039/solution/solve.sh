#!/bin/bash
# Oracle (60 - 25 = 35).
echo 35 > /app/answer.txt
