#!/bin/bash
# Oracle (rename 5 .txt files).
for f in /app/data/*.txt; do mv -- "$f" "${f%.txt}.md"; done
