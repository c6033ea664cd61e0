#!/bin/bash
# Oracle (89 - 74 = 15).
echo 15 > /app/answer.txt
