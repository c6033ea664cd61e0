#!/bin/bash
# Oracle (68 - 65 = 3).
echo 3 > /app/answer.txt
