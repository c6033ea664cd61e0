#!/bin/bash
# Verifier (rename 5 .txt files).
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
[ ! -e /app/data/moss.txt ] || reward=0
[ "$(trimmed /app/data/moss.md)" = 'moss 199' ] || reward=0
[ ! -e /app/data/maple.txt ] || reward=0
[ "$(trimmed /app/data/maple.md)" = 'maple 803' ] || reward=0
[ ! -e /app/data/bright.txt ] || reward=0
[ "$(trimmed /app/data/bright.md)" = 'bright 193' ] || reward=0
[ ! -e /app/data/lotus.txt ] || reward=0
[ "$(trimmed /app/data/lotus.md)" = 'lotus 992' ] || reward=0
[ ! -e /app/data/quill.txt ] || reward=0
[ "$(trimmed /app/data/quill.md)" = 'quill 424' ] || reward=0
[ "$(trimmed /app/data/ember.log)" = 'ember 608' ] || reward=0
[ "$(trimmed /app/data/harbor.csv)" = 'harbor 221' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
