#!/bin/bash
# Oracle (7 distinct names).
sort -u /app/names.txt > /app/sorted.txt
