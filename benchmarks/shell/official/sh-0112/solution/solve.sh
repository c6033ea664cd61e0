#!/bin/bash
# Oracle (ember occurs 4 times).
grep -ow 'ember' /app/text.txt | wc -l > /app/answer.txt
