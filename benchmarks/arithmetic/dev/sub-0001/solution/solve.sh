#!/bin/bash
# Oracle (83 - 76 = 7).
echo 7 > /app/answer.txt
