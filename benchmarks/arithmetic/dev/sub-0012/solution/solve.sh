#!/bin/bash
# Oracle (66 - 39 = 27).
echo 27 > /app/answer.txt
