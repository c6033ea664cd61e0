#!/bin/bash
# Oracle (rename 4 .txt files).
for f in /app/data/*.txt; do mv -- "$f" "${f%.txt}.md"; done
