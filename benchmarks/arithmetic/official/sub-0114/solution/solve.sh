#!/bin/bash
# Oracle (53 - 27 = 26).
echo 26 > /app/answer.txt
