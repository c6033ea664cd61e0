#!/bin/bash
# Oracle (quill occurs 16 times).
grep -ow 'quill' /app/text.txt | wc -l > /app/answer.txt
