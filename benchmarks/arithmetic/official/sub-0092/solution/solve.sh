#!/bin/bash
# Oracle (97 - 37 = 60).
echo 60 > /app/answer.txt
