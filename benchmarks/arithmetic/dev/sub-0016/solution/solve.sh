#!/bin/bash
# Oracle (69 - 63 = 6).
echo 6 > /app/answer.txt
