#!/bin/bash
# Oracle (71 - 61 = 10).
echo 10 > /app/answer.txt
