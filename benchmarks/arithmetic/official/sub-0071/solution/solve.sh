#!/bin/bash
# Oracle (56 - 42 = 14).
echo 14 > /app/answer.txt
