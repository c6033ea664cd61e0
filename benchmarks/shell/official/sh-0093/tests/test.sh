#!/bin/bash
# Verifier (7 distinct names).
# Runs from /app; always writes 0 or 1 to /logs/verifier/reward.txt and exits 0.
mkdir -p /logs/verifier
reward=0

# Print a file's lines with trailing whitespace and trailing blank lines removed.
lines() {
  [ -f "$1" ] || return 1
  local s
  s="$(sed 's/[[:space:]]*$//' -- "$1" 2>/dev/null)" || return 1
  printf '%s' "$s"
}

want="$(cat <<'__EXPECTED__'
alice
bob
carol
ivan
peggy
rupert
victor
__EXPECTED__
)"
if got="$(lines /app/sorted.txt)" && [ "$got" = "$want" ]; then reward=1; fi

echo "$reward" > /logs/verifier/reward.txt
exit 0
