#!/bin/bash
# Verifier (rename 4 .txt files).
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
[ ! -e /app/data/pixel.txt ] || reward=0
[ "$(trimmed /app/data/pixel.md)" = 'pixel 320' ] || reward=0
[ ! -e /app/data/ember.txt ] || reward=0
[ "$(trimmed /app/data/ember.md)" = 'ember 776' ] || reward=0
[ ! -e /app/data/sand.txt ] || reward=0
[ "$(trimmed /app/data/sand.md)" = 'sand 401' ] || reward=0
[ ! -e /app/data/orbit.txt ] || reward=0
[ "$(trimmed /app/data/orbit.md)" = 'orbit 955' ] || reward=0
[ "$(trimmed /app/data/quill.md.bak)" = 'quill 111' ] || reward=0
[ "$(trimmed /app/data/cloud.csv)" = 'cloud 111' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
