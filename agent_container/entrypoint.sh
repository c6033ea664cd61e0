#!/bin/sh
# Entry point of the research agent's container.
#  1. RSIGYM_URL and RSIGYM_API_KEY must be set (the gateway and this run's key; nothing else).
#  2. Point the unmodified OpenAI and Anthropic SDKs at the gateway's agent route (the research
#     agent's own model, on the run's agent-model meter) with the run key, unless the caller set
#     OPENAI_BASE_URL / OPENAI_API_KEY / ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY itself.
#  3. A coding-agent CLI's configuration (the agent route, the MCP server `gym mcp`; written by the
#     launcher, ops/agent_setup.py, no key in it) mounted at /run/rsigym/setup is copied into HOME.
#  4. Smoke check: `gym balance` must answer (retried a few times while the gateway starts).
#  5. exec the given command (default: bash).
set -eu

missing=""
[ -n "${RSIGYM_URL:-}" ] || missing="$missing RSIGYM_URL"
[ -n "${RSIGYM_API_KEY:-}" ] || missing="$missing RSIGYM_API_KEY"
if [ -n "$missing" ]; then
    echo "rsigym-agent: missing:$missing. Set the gateway URL and this run's key, e.g." >&2
    echo "  RSIGYM_API_KEY=\$(rsigym keys create --track joint --budget 5 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"key\"])')" >&2
    exit 64
fi

export OPENAI_BASE_URL="${OPENAI_BASE_URL:-${RSIGYM_URL%/}/agent/v1}"
export OPENAI_API_KEY="${OPENAI_API_KEY:-$RSIGYM_API_KEY}"
export ANTHROPIC_BASE_URL="${ANTHROPIC_BASE_URL:-${RSIGYM_URL%/}/agent}"
export ANTHROPIC_API_KEY="${ANTHROPIC_API_KEY:-$RSIGYM_API_KEY}"

if [ -d /run/rsigym/setup ]; then
    cp -R /run/rsigym/setup/. "$HOME"/
fi

attempts="${RSIGYM_SMOKE_ATTEMPTS:-5}"
n=1
until gym balance; do
    if [ "$n" -ge "$attempts" ]; then
        echo "rsigym-agent: 'gym balance' failed $n times: is the gateway at $RSIGYM_URL up, and the key valid?" >&2
        exit 69
    fi
    n=$((n + 1))
    sleep 2
done

[ "$#" -gt 0 ] || set -- bash
exec "$@"
