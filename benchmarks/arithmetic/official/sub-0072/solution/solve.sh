#!/bin/bash
# Oracle (76 - 32 = 44).
echo 44 > /app/answer.txt
