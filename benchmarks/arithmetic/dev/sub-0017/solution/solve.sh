#!/bin/bash
# Oracle (37 - 22 = 15).
echo 15 > /app/answer.txt
