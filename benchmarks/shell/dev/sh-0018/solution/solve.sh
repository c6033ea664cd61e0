#!/bin/bash
# Oracle (rename 3 .txt files).
for f in /app/data/*.txt; do mv -- "$f" "${f%.txt}.md"; done
