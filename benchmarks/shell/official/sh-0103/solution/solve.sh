#!/bin/bash
# Oracle (8 distinct names).
sort -u /app/names.txt > /app/sorted.txt
