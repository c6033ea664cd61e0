#!/bin/bash
# Oracle (49 - 20 = 29).
echo 29 > /app/answer.txt
