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
[ ! -e /app/data/pixel.txt ] || reward=0
[ "$(trimmed /app/data/pixel.md)" = 'pixel 177' ] || reward=0
[ ! -e /app/data/orbit.txt ] || reward=0
[ "$(trimmed /app/data/orbit.md)" = 'orbit 883' ] || reward=0
[ ! -e /app/data/lotus.txt ] || reward=0
[ "$(trimmed /app/data/lotus.md)" = 'lotus 314' ] || reward=0
[ "$(trimmed /app/data/ember.md.bak)" = 'ember 232' ] || reward=0
[ "$(trimmed /app/data/maple.log)" = 'maple 388' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
