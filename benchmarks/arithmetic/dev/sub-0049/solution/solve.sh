#!/bin/bash
# Oracle (77 - 74 = 3).
echo 3 > /app/answer.txt
