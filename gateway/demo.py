"""``rsigym demo``: start a throw-away embedded gym and run the main job end to end.

Operator and agent do what they would in a real run, through the real interfaces:
the operator creates a run key with the `rsigym` CLI; the agent checks its balance,
lists and calls rollout models (plain and streamed), mints a narrower child key for a
reviewer role, and spends until the gateway refuses with 402; the operator revokes the
child and reads the itemized ledger. The frontier model is the offline stand-in provider
(services/rollout/standin.py), reached through LiteLLM exactly like a real provider.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console

console = Console()
DEMO_KEY_ENV = "RSIGYM_DEMO_TEACHER_KEY"


@contextmanager
def _process(args: list[str], env: dict[str, str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{args[2:4]} did not start; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _rsigym(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "gateway.cli.main", *args], env={**env, "COLUMNS": "200"}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"rsigym {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout


def run_demo(data_dir: Path | None = None, port: int = 8700) -> int:
    from rsigym import BudgetExhaustedError, Gym  # the agent side: the SDK only

    data = Path(data_dir or tempfile.mkdtemp(prefix="rsigym-demo-"))
    data.mkdir(parents=True, exist_ok=True)
    provider_port = port + 99
    provider_secret = "sk-demo-" + secrets.token_hex(16)
    config = data / "gym.toml"
    config.write_text(
        f"""[ledger]
reservation_ttl_s = 600

[rollout]
default_max_tokens = 64

[[rollout.models]]
name = "teacher"
litellm_model = "openai/teacher"
api_base = "http://127.0.0.1:{provider_port}/v1"
api_key_env = "{DEMO_KEY_ENV}"
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""
    )
    url = f"http://127.0.0.1:{port}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    platform_env = {**base_env, DEMO_KEY_ENV: provider_secret, "RSIGYM_DATA_DIR": str(data)}
    operator_env = {**base_env, "RSIGYM_URL": url, "RSIGYM_DATA_DIR": str(data)}
    python = sys.executable

    console.rule("[bold]RSIGym demo")
    console.print(f"data dir {data}")
    with _process([python, "-m", "gateway.cli.main", "standin", "--port", str(provider_port), "--api-key-env", DEMO_KEY_ENV],
                  platform_env, f"http://127.0.0.1:{provider_port}/v1/models", data / "standin.log"), \
         _process([python, "-m", "gateway.cli.main", "up", "--config", str(config), "--data-dir", str(data), "--port", str(port)],
                  platform_env, f"{url}/healthz", data / "gym.log"):
        console.print(f"[green]gym up[/green] at {url} (gateway + services, one process); admin token in {data / 'admin-token'}")

        console.rule("operator")
        created = json.loads(_rsigym("keys", "create", "--track", "joint", "--budget", "0.0005", "--json", env=operator_env))
        console.print(f"rsigym keys create --track joint --budget 0.0005 --json → id {created['id']}")

        console.rule("agent")
        gym = Gym(base_url=url, api_key=created["key"])
        console.print(f"balance: {gym.balance().model_dump()}")
        console.print(f"models: {[(m.id, m.pricing) for m in gym.rollout.models()]}")
        reply = gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "What is 1234 + 4321?"}], max_tokens=16)
        console.print(f"chat: {reply.choices[0].message.content!r}  cost ${reply.cost_usd:.6f}  remaining ${reply.remaining_usd:.6f}")
        with gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "Describe research."}], max_tokens=24,
                              stream=True, stream_options={"include_usage": True}) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        console.print(f"stream: {text[:70]!r}…  exact cost ${stream.cost_usd:.6f}")
        reviewer = gym.keys.mint(name="reviewer", budget_usd=0.0001,
                                 policy={"services": {"rollout": {"models": ["teacher"], "max_concurrency": 2,
                                                                  "fields": {"temperature": {"fixed": 0.0}}}}})
        console.print(f"minted child key {reviewer.id} (rollout only, temperature fixed at 0, sub-budget $0.0001)")
        child = Gym(base_url=url, api_key=reviewer.key)
        try:
            child.rollout.chat(model="teacher", messages=[{"role": "user", "content": "x"}], temperature=0.9)
        except Exception as err:  # noqa: BLE001 - shown to the reader
            console.print(f"child asks for temperature 0.9 → {type(err).__name__}: {getattr(err, 'message', err)}")
        calls, refused = 0, None
        while refused is None and calls < 200:
            try:
                gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "Keep talking."}], max_tokens=48)
                calls += 1
            except BudgetExhaustedError as err:
                refused = err
        balance = gym.balance()
        console.print(f"{calls} more calls, then 402 {refused.type if refused else '-'}; "
                      f"spent ${balance.spent_usd:.6f} of ${balance.budget_usd:.6f}, reserved ${balance.reserved_usd:.6f}")

        console.rule("operator")
        _rsigym("keys", "revoke", reviewer.id, env=operator_env)
        try:
            child.balance()
        except Exception as err:  # noqa: BLE001
            console.print(f"revoked child key → {type(err).__name__} ({getattr(err, 'status_code', '')})")
        console.print(_rsigym("ledger", created["id"], env=operator_env))
        ok = balance.spent_usd <= balance.budget_usd and balance.reserved_usd == 0 and refused is not None
        console.rule("[green]demo passed" if ok else "[red]demo failed")
        return 0 if ok else 1
