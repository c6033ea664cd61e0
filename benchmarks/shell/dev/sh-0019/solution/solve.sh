#!/bin/bash
# Oracle (quill -> comet).
sed -i 's/quill/comet/g' /app/message.txt
