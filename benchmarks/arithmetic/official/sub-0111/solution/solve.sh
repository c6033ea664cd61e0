#!/bin/bash
# Oracle (68 - 20 = 48).
echo 48 > /app/answer.txt
