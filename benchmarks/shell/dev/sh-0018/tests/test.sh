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
[ ! -e /app/data/wolf.txt ] || reward=0
[ "$(trimmed /app/data/wolf.md)" = 'wolf 199' ] || reward=0
[ ! -e /app/data/cloud.txt ] || reward=0
[ "$(trimmed /app/data/cloud.md)" = 'cloud 185' ] || reward=0
[ ! -e /app/data/moss.txt ] || reward=0
[ "$(trimmed /app/data/moss.md)" = 'moss 502' ] || reward=0
[ "$(trimmed /app/data/ember.md.bak)" = 'ember 602' ] || reward=0
[ "$(trimmed /app/data/lotus.csv)" = 'lotus 288' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
