"""A scripted research agent (stdlib only: it runs under the system python, inside the launcher's
namespaces). It reads its instruction, prints the names of its environment variables, checks its
balance, calls the agent route once, probes what it must not reach, and exits 0.

``--probe-port N`` (repeatable) and ``--probe-path P`` (repeatable) add checks; ``--fetch URL``
(repeatable) fetches through whatever proxy the environment names (the egress allowlist);
``--work`` spends on both meters (one rollout call, one agent-model call) and starts a long
training job; ``--sleep S`` then waits (for the run's wall clock to stop it). Every line printed
is ``name: value`` JSON after the colon, for tests to read."""

import argparse
import json
import os
import socket
import time
import urllib.error
import urllib.request


def call(path: str, body: object = None, raw: bytes | None = None) -> tuple[int, object]:
    headers = {"Authorization": "Bearer " + os.environ["RSIGYM_API_KEY"]}
    data = raw
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(os.environ["RSIGYM_URL"] + path, data=data, headers=headers)
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


def fetch(url: str) -> object:
    """GET through the environment's proxy settings (HTTP_PROXY / HTTPS_PROXY, as pip and curl)."""
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return [response.status, response.read(200).decode(errors="replace")]
    except urllib.error.HTTPError as err:
        return [err.code, err.read(300).decode(errors="replace")]
    except OSError as err:
        return [0, type(err).__name__]


def work() -> None:
    """Spend on both meters and leave a long training job running."""
    chat = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
    models = call("/rollout/v1/models")[1]
    teacher = models["data"][0]["id"] if isinstance(models, dict) and models.get("data") else "teacher"
    print("rollout:", json.dumps(call("/rollout/v1/chat/completions", {**chat, "model": teacher})[0]))
    agent_models = call("/agent/v1/models")[1]
    if isinstance(agent_models, dict) and agent_models.get("data"):
        model = agent_models["data"][0]["id"]
        print("agent_chat:", json.dumps(call("/agent/v1/chat/completions", {**chat, "model": model})[0]))
    rows = "".join(json.dumps({"messages": [{"role": "user", "content": f"Repeat: red lion {i}"},
                                            {"role": "assistant", "content": f"red lion {i}"}]}) + "\n"
                   for i in range(8))
    status, dataset = call("/training/v1/datasets", raw=rows.encode())
    print("dataset:", json.dumps(status))
    if status == 201 and isinstance(dataset, dict):
        status, job = call("/training/v1/jobs", {"datasets": [dataset["id"]], "base_model": "tiny", "steps": 5000,
                                                 "batch_size": 4, "max_length": 64, "checkpoint_every": 10000})
        print("job:", json.dumps([status, job.get("id") if isinstance(job, dict) else job]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe-port", type=int, action="append", default=[])
    parser.add_argument("--probe-path", action="append", default=[])
    parser.add_argument("--fetch", action="append", default=[])
    parser.add_argument("--work", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
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
    if args.fetch:
        print("fetch:", json.dumps({url: fetch(url) for url in args.fetch}), flush=True)
    if args.work:
        work()
    if args.sleep:
        print("sleeping:", json.dumps(args.sleep), flush=True)
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
