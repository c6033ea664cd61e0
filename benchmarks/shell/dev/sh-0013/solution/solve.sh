#!/bin/bash
# Oracle (6 distinct names).
sort -u /app/names.txt > /app/sorted.txt
