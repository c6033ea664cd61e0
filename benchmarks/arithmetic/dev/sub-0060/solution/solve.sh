#!/bin/bash
# Oracle (97 - 83 = 14).
echo 14 > /app/answer.txt
