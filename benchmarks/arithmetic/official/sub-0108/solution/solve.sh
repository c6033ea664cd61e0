#!/bin/bash
# Oracle (98 - 49 = 49).
echo 49 > /app/answer.txt
