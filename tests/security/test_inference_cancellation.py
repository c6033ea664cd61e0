"""Inference work stops with its caller: a streamed completion whose client goes away stops
generating within a few tokens, is settled for the tokens it generated (not its whole
reservation, not nothing), leaves no hold, and frees the model for the next call. And a
request cannot make every token scan a long ``stop`` list."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from billing.money import nusd_to_usd
from kit.config import BaseModel_
from services.inference.backends.base import Adapter, Generation, InferenceEngine, Sampling
from services.inference.service import chat_cost
from tests.conftest import create_key
from tests.fakes.servers import serve_gym

TOKEN_S = 0.02
MAX_TOKENS = 120


class Paced:
    """The real local engine at one token per ``TOKEN_S`` (a larger model's pace), so that a
    disconnect lands mid-generation; it records every generation it ran."""

    def __init__(self, engine: InferenceEngine):
        self.engine = engine
        self.generations: list[Generation] = []
        self.prompt_counts: list[int] = []

    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int:
        count = self.engine.prompt_tokens(base, prompt)
        self.prompt_counts.append(count)
        return count

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        def paced(piece: str) -> None:
            time.sleep(TOKEN_S)
            if on_text is not None:
                on_text(piece)

        generation = self.engine.generate(base, adapter, prompt, sampling, paced)
        self.generations.append(generation)
        return generation


@pytest.fixture
def live(gym: Any) -> Iterator[dict[str, Any]]:
    service = gym.service_apps["inference"].state.inference
    paced = Paced(service.engine)
    service.engine = paced
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as admin:
        key = create_key(admin, budget_usd=1.0)
        client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key['key']}"})
        try:
            yield {"client": client, "key": key, "paced": paced, "service": service, "gym": gym}
        finally:
            client.close()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "temperature": 1.0, "max_tokens": MAX_TOKENS, **extra}


def test_a_disconnect_stops_generation_and_settles_the_tokens_generated(live: dict[str, Any]) -> None:
    client, paced, service = live["client"], live["paced"], live["service"]
    # The tiny model answers arithmetic in 2-3 tokens; with its end tokens ignored it writes on
    # (a long answer): uncut, the stream below would run to MAX_TOKENS.
    base = live["gym"].gateway.config.base_model("tiny")
    paced.engine.engines["local"]._base(base).end_ids = set()
    uncut = client.post("/inference/v1/chat/completions", json=chat(seed=1)).json()
    assert uncut["choices"][0]["finish_reason"] == "length", uncut
    assert paced.generations[-1].completion_tokens == MAX_TOKENS
    seed, before = 1, len(paced.generations)

    read = 0
    with client.stream("POST", "/inference/v1/chat/completions", json=chat(seed=seed, stream=True)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                read += 1
                if read == 3:
                    break  # the client goes away mid-stream

    deadline = time.monotonic() + 60
    while len(paced.generations) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(paced.generations) == before + 1, "the generation did not end"
    generation = paced.generations[-1]
    assert generation.finish_reason == "cancelled"
    assert 3 <= generation.completion_tokens <= 3 + 10, generation  # stopped within a few tokens

    balance = client.get("/v1/balance").json()
    while balance["reserved_usd"] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        balance = client.get("/v1/balance").json()
    assert balance["reserved_usd"] == 0, balance  # no hold left behind
    rows = [r for r in live["gym"].gateway.ledger.entries(live["key"]["id"]) if r["service"] == "inference"]
    streamed = rows[0] if rows[0]["created_at"] >= rows[-1]["created_at"] else rows[-1]
    owed = nusd_to_usd(chat_cost(base, paced.prompt_counts[-1], generation.completion_tokens))
    assert streamed["status"] == "settled"
    assert streamed["actual_usd"] == owed < streamed["estimate_usd"], streamed  # the tokens, not the hold
    assert service.abandoned_streams == 1

    # the model is free: the next call of the run is served (and runs to its own end)
    after = client.post("/inference/v1/chat/completions", json=chat(seed=seed, max_tokens=5))
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 5


def test_stop_lists_are_bounded(live: dict[str, Any]) -> None:
    client = live["client"]
    spent = client.get("/v1/balance").json()["spent_usd"]
    for stop, why in ((["a", "b", "c", "d", "e"], "at most 4"), (["x" * 65], "64 characters")):
        r = client.post("/inference/v1/chat/completions", json=chat(stop=stop, max_tokens=4))
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["type"] == "error" and body["error"]["param"] == "stop" and why in body["error"]["message"]
    assert client.get("/v1/balance").json()["spent_usd"] == spent  # refused before any work or charge
    ok = client.post("/inference/v1/chat/completions", json=chat(stop=["a", "b", "c", "\n"], max_tokens=4))
    assert ok.status_code == 200, ok.text
