#!/bin/bash
# Oracle (93 - 60 = 33).
echo 33 > /app/answer.txt
