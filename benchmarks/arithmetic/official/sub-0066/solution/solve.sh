#!/bin/bash
# Oracle (77 - 37 = 40).
echo 40 > /app/answer.txt
