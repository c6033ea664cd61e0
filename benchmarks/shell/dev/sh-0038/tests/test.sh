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
[ ! -e /app/data/frost.txt ] || reward=0
[ "$(trimmed /app/data/frost.md)" = 'frost 918' ] || reward=0
[ ! -e /app/data/orbit.txt ] || reward=0
[ "$(trimmed /app/data/orbit.md)" = 'orbit 375' ] || reward=0
[ ! -e /app/data/cloud.txt ] || reward=0
[ "$(trimmed /app/data/cloud.md)" = 'cloud 573' ] || reward=0
[ ! -e /app/data/ember.txt ] || reward=0
[ "$(trimmed /app/data/ember.md)" = 'ember 334' ] || reward=0
[ "$(trimmed /app/data/lotus.csv)" = 'lotus 804' ] || reward=0
[ "$(trimmed /app/data/wolf.log)" = 'wolf 107' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
