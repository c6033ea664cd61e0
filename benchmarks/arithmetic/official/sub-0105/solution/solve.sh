#!/bin/bash
# Oracle (83 - 25 = 58).
echo 58 > /app/answer.txt
