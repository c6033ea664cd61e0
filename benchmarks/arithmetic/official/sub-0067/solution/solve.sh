#!/bin/bash
# Oracle (76 - 69 = 7).
echo 7 > /app/answer.txt
