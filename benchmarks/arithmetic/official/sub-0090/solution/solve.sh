#!/bin/bash
# Oracle (62 - 46 = 16).
echo 16 > /app/answer.txt
