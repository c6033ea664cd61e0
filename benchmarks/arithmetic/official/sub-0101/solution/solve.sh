#!/bin/bash
# Oracle (97 - 68 = 29).
echo 29 > /app/answer.txt
