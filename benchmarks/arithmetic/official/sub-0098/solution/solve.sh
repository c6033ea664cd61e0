#!/bin/bash
# Oracle (51 - 18 = 33).
echo 33 > /app/answer.txt
