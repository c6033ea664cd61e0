#!/bin/bash
# Oracle (frost occurs 6 times).
grep -ow 'frost' /app/text.txt | wc -l > /app/answer.txt
