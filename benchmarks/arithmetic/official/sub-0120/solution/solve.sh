#!/bin/bash
# Oracle (77 - 28 = 49).
echo 49 > /app/answer.txt
