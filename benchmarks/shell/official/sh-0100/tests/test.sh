#!/bin/bash
# Verifier (largest = 9508).
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

if got="$(trimmed /app/answer.txt)" && [ "$got" = '9508' ]; then reward=1; fi

echo "$reward" > /logs/verifier/reward.txt
exit 0
