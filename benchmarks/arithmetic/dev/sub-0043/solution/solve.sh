#!/bin/bash
# Oracle (96 - 10 = 86).
echo 86 > /app/answer.txt
