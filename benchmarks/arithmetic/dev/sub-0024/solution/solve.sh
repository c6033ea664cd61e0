#!/bin/bash
# Oracle (66 - 41 = 25).
echo 25 > /app/answer.txt
