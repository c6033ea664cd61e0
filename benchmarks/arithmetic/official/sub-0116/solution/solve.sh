#!/bin/bash
# Oracle (71 - 63 = 8).
echo 8 > /app/answer.txt
