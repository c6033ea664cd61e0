#!/bin/bash
# Oracle (63 - 49 = 14).
echo 14 > /app/answer.txt
