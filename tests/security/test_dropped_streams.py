"""A streamed chat completion whose client goes away as it starts holds nothing afterwards.

An agent (or its flaky network) sends a streamed completion and closes the socket at once, or
a moment later, again and again. The gym in its own process (``rsigym up``'s server) must close
every such call: each reservation settled or released, nothing left reserved on the key, no call
counted in flight. Written against a first form of the in-process hot route that read the
service's stream in the gateway's own task: its first run there found 75 of 80 reservations held
and 75 calls in flight three seconds after (nine runs after it did not), and that form was
reverted; the form the gateway reads such streams with now (gateway/direct_call.py) passes it.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ADMIN_TOKEN, TEACHER_ENV
from tests.fakes.gym_process import gym_process

DELAYS_S = (0.0, 0.0, 0.0, 0.0005, 0.001, 0.002, 0.003, 0.005) * 5
"""How long after sending its request each client waits before it closes its socket."""


def _config(api_base: str) -> str:
    return ("[[rollout.models]]\nname = \"teacher\"\nlitellm_model = \"openai/teacher\"\n"
            f"api_base = \"{api_base}\"\napi_key_env = \"{TEACHER_ENV}\"\n"
            "input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n")


def _in_flight(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith('rsigym_in_flight{service="rollout"}'))


def test_streams_dropped_as_they_start_leave_nothing_held(tmp_path: Path, standin: tuple[str, Any],
                                                          teacher_secret: str) -> None:
    with gym_process(tmp_path / "data", _config(standin[0]), env={TEACHER_ENV: teacher_secret}) as gym:
        key = gym.key()
        body = json.dumps({"model": "teacher", "stream": True, "max_tokens": 32,
                           "messages": [{"role": "user", "content": "What is 12 + 30?"}]}).encode()
        head = (f"POST /rollout/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        for delay in DELAYS_S:
            sock = socket.create_connection(("127.0.0.1", gym.port), timeout=10)
            sock.sendall(head + body)
            if delay:
                time.sleep(delay)
            sock.close()
        with httpx.Client(base_url=gym.url, timeout=30) as client:
            deadline = time.monotonic() + 20
            while True:
                balance = client.get("/v1/balance", headers={"Authorization": f"Bearer {key}"}).json()
                metrics = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text
                if (balance["reserved_usd"] == 0 and _in_flight(metrics) == 0) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert balance["reserved_usd"] == 0, balance
            assert _in_flight(metrics) == 0, [line for line in metrics.splitlines() if "in_flight" in line]
            # and the gym still serves the key: nothing it held was lost
            r = client.post("/rollout/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"model": "teacher", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
