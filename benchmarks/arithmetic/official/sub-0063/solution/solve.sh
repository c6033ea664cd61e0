#!/bin/bash
# Oracle (77 - 13 = 64).
echo 64 > /app/answer.txt
