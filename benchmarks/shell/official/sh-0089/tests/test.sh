#!/bin/bash
# Verifier (lotus -> willow).
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
orbit sand orbit orbit
sand ember willow
pixel maple orbit pixel pixel
pixel pixel pixel maple orbit willow maple
willow sand sand willow
ember maple ember maple orbit maple
pixel sand maple willow sand maple
orbit sand orbit willow
__EXPECTED__
)"
if got="$(lines /app/message.txt)" && [ "$got" = "$want" ]; then reward=1; fi

echo "$reward" > /logs/verifier/reward.txt
exit 0
