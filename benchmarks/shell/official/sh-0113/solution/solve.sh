#!/bin/bash
# Oracle (9 distinct names).
sort -u /app/names.txt > /app/sorted.txt
