#!/bin/bash
# Verifier (rename 3 .txt files).
# Runs from /app; always writes 0 or 1 to /logs/verifier/reward.txt and exits 0.
mkdir -p /logs/verifier
reward=0

# Print a file with leading/trailing whitespace removed; fail when it is not a file.
trimmed() {
  [ -f "$1" ] || return 1
  local s
  s="$(cat -- "$1" 2>/dev/null)" || return 1
  s="${s#"${s%%[![:space:]]*}"}"
  s="${s%"${s##*[![:space:]]}"}"
  printf '%s' "$s"
}

reward=1
[ ! -e /app/data/quill.txt ] || reward=0
[ "$(trimmed /app/data/quill.md)" = 'quill 712' ] || reward=0
[ ! -e /app/data/bright.txt ] || reward=0
[ "$(trimmed /app/data/bright.md)" = 'bright 651' ] || reward=0
[ ! -e /app/data/tiger.txt ] || reward=0
[ "$(trimmed /app/data/tiger.md)" = 'tiger 588' ] || reward=0
[ "$(trimmed /app/data/cloud.md.bak)" = 'cloud 167' ] || reward=0
[ "$(trimmed /app/data/orbit.log)" = 'orbit 793' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
