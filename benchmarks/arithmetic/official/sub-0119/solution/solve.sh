#!/bin/bash
# Oracle (96 - 67 = 29).
echo 29 > /app/answer.txt
