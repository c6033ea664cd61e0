#!/bin/bash
# Oracle (76 - 45 = 31).
echo 31 > /app/answer.txt
