"""Acceptance: no provider secret appears in any response or log captured by the tests."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import MetaData, select

from kit.config import GymConfig
from tests.conftest import TEACHER_ENV, admin_headers, bearer, client_for, create_key, gym_config

WRONG_ENV = "RSIGYM_TEST_WRONG_KEY"


def _config(api_base: str) -> GymConfig:
    config = gym_config(api_base)
    extra = [
        {"name": "misconfigured", "litellm_model": "openai/misconfigured", "api_base": api_base,
         "api_key_env": WRONG_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0},
        {"name": "offline", "litellm_model": "openai/offline", "api_base": "http://127.0.0.1:9/v1",
         "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0},
    ]
    return GymConfig.model_validate({"rollout": {"models": [*(m.model_dump() for m in config.rollout.models), *extra]}})


def test_provider_secrets_never_leave_the_platform(make_gym: Any, standin: Any, teacher_secret: str,
                                                    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_secret = "sk-wrong-" + teacher_secret[::-1]
    gym = make_gym(config=_config(standin[0]), secrets_={TEACHER_ENV: teacher_secret, WRONG_ENV: wrong_secret})
    client = client_for(gym)
    key = create_key(client, 1.0)["key"]
    seen: list[str] = []

    def call(model: str, **extra: Any) -> Any:
        body = {"model": model, "messages": [{"role": "user", "content": "What is 1 + 1?"}], "max_tokens": 4, **extra}
        r = client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key))
        seen.append(r.text + str(dict(r.headers)))
        return r

    ok = call("teacher")
    assert ok.status_code == 200  # the secret was used: the stand-in checks it
    assert call("teacher", stream=True).status_code == 200
    refused = call("misconfigured")
    assert refused.status_code == 502 and "credentials" in refused.json()["error"]["message"]
    unreachable = call("offline")
    assert unreachable.status_code == 502
    seen.append(client.get("/rollout/v1/models", headers=bearer(key)).text)
    seen.append(client.get("/metrics", headers=admin_headers()).text)
    logging.getLogger("some.library").debug("upstream call with key %s", teacher_secret)  # even if a library logged it

    out, err = capfd.readouterr()
    haystacks = {"responses": "\n".join(seen), "logs": caplog.text, "stdout": out, "stderr": err}
    for where, text in haystacks.items():
        for secret in (teacher_secret, wrong_secret):
            assert secret not in text, f"a provider secret leaked into {where}"
    assert "[redacted]" in caplog.text
    meta = MetaData()
    meta.reflect(gym.gateway.store.engine)
    with gym.gateway.store.engine.connect() as conn:
        dump = " ".join(str(row) for table in meta.sorted_tables for row in conn.execute(select(table)))
    assert teacher_secret not in dump and wrong_secret not in dump
