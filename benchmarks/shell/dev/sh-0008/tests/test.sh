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
[ "$(trimmed /app/data/frost.md)" = 'frost 507' ] || reward=0
[ ! -e /app/data/harbor.txt ] || reward=0
[ "$(trimmed /app/data/harbor.md)" = 'harbor 890' ] || reward=0
[ ! -e /app/data/tiger.txt ] || reward=0
[ "$(trimmed /app/data/tiger.md)" = 'tiger 203' ] || reward=0
[ ! -e /app/data/lotus.txt ] || reward=0
[ "$(trimmed /app/data/lotus.md)" = 'lotus 768' ] || reward=0
[ "$(trimmed /app/data/quill.csv)" = 'quill 697' ] || reward=0
[ "$(trimmed /app/data/sand.log)" = 'sand 363' ] || reward=0

echo "$reward" > /logs/verifier/reward.txt
exit 0
