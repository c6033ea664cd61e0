#!/bin/bash
# Oracle (45 - 18 = 27).
echo 27 > /app/answer.txt
