#!/bin/bash
# Oracle (40 - 13 = 27).
echo 27 > /app/answer.txt
