#!/bin/bash
# Oracle (77 - 64 = 13).
echo 13 > /app/answer.txt
