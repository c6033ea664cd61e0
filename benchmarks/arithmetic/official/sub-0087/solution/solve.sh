#!/bin/bash
# Oracle (91 - 18 = 73).
echo 73 > /app/answer.txt
