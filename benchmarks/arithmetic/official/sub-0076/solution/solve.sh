#!/bin/bash
# Oracle (76 - 47 = 29).
echo 29 > /app/answer.txt
