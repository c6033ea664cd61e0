"""A scripted research agent (stdlib only: it runs under the system python, inside the launcher's
namespaces). It reads its instruction, prints the names of its environment variables, checks its
balance, calls the agent route once, probes what it must not reach, and exits 0.

``--probe-port N`` (repeatable) and ``--probe-path P`` (repeatable) add checks; every line printed
is ``name: value`` JSON after the colon, for tests to read."""

import argparse
import json
import os
import socket
import urllib.error
import urllib.request


def call(path: str) -> tuple[int, object]:
    request = urllib.request.Request(os.environ["RSIGYM_URL"] + path,
                                     headers={"Authorization": "Bearer " + os.environ["RSIGYM_API_KEY"]})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")[:300]
    except OSError as err:
        return 0, type(err).__name__


def reach(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return "connected"
    except OSError as err:
        return type(err).__name__


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe-port", type=int, action="append", default=[])
    parser.add_argument("--probe-path", action="append", default=[])
    args = parser.parse_args()
    with open(os.environ["RSIGYM_INSTRUCTION"]) as fh:
        instruction = fh.read()
    print("instruction_chars:", json.dumps(len(instruction)))
    # LC_CTYPE is this interpreter's own (PEP 538 locale coercion under the C locale), not the launcher's
    print("env:", json.dumps(sorted(k for k in os.environ if k != "LC_CTYPE")))
    print("balance:", json.dumps(call("/v1/balance")))
    status, _ = call("/agent/v1/models")
    print("agent_models_status:", json.dumps(status))
    print("reach:", json.dumps({str(p): reach(p) for p in [5432, 6379, *args.probe_port]}))
    print("paths:", json.dumps({p: os.path.exists(p) for p in args.probe_path}))
    print("root:", json.dumps(sorted(os.listdir("/"))), flush=True)


if __name__ == "__main__":
    main()
