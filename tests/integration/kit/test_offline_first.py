"""A gym started without a config works offline, and a provider that cannot answer is told
plainly (issue 16, item 1): the default catalogue's teacher and judge are the stand-in provider,
served inside the rollout service over the OpenAI API; a model whose key variable is unset
is warned about at start, one line each, and refused unbilled; an upstream failure is logged for the
operator (model, provider, status, redacted detail) and the agent's error names the model and says
whether it was billed."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from kit.config import GymConfig, load_config, missing_provider_keys
from tests.conftest import TEACHER_ENV, admin_headers, bearer, client_for, create_key, gym_config

ABSENT = ("RSIGYM_TEST_ABSENT_KEY_A", "RSIGYM_TEST_ABSENT_KEY_B")
WRONG_ENV = "RSIGYM_TEST_WRONG_KEY"


def chat(client: httpx.Client, key: str, model: str, content: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **extra}
    return client.post("/rollout/v1/chat/completions", json=body, headers=bearer(key))


def spent(client: httpx.Client, key_id: str) -> tuple[float, list[str]]:
    shown = client.get(f"/admin/v1/keys/{key_id}", headers=admin_headers()).json()
    rows = client.get(f"/admin/v1/keys/{key_id}/ledger", headers=admin_headers()).json()["data"]
    return shown["spent_usd"], [r["status"] for r in rows]


def test_a_gym_without_a_config_has_an_offline_teacher_and_judge(make_gym: Any) -> None:
    config = load_config(None)
    assert missing_provider_keys(config, {}) == []
    assert config.audit.judge_model == "judge" and config.tracks.teachers == ["teacher", "judge"]
    client = client_for(make_gym(config=config, secrets_={}))  # no provider key at all
    run = create_key(client, 1.0)
    listed = client.get("/rollout/v1/models", headers=bearer(run["key"])).json()["data"]
    assert [m["id"] for m in listed] == ["teacher", "judge"]

    answered = chat(client, run["key"], "teacher", "What is 1234 + 4321?")
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "5555"
    assert answered.json()["usage"]["cost_usd"] > 0
    with client.stream("POST", "/rollout/v1/chat/completions", headers=bearer(run["key"]),
                       json={"model": "teacher", "messages": [{"role": "user", "content": "Describe research."}],
                             "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}) as r:
        streamed = r.read().decode()
    assert r.status_code == 200 and '"completion_tokens":6' in streamed and "[DONE]" in streamed
    usd, statuses = spent(client, run["id"])
    assert usd > 0 and statuses == ["settled", "settled"]


def test_a_missing_provider_key_is_warned_at_start_and_refused_unbilled(
        make_gym: Any, standin: Any, teacher_secret: str, caplog: pytest.LogCaptureFixture) -> None:
    base = gym_config(standin[0])
    absent = [{"name": f"absent-{i}", "litellm_model": f"openai/absent-{i}", "api_base": standin[0], "api_key_env": env,
               "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0} for i, env in enumerate(ABSENT)]
    config = GymConfig.model_validate({"rollout": {"models": [*(m.model_dump() for m in base.rollout.models), *absent]}})
    caplog.set_level(logging.WARNING, logger="rsigym.rollout")
    client = client_for(make_gym(config=config, secrets_={TEACHER_ENV: teacher_secret}))
    warned = [r.getMessage() for r in caplog.records if "is not set" in r.getMessage()]
    assert len(warned) == 2  # one line per model, the configured ones with keys stay quiet
    for i, env in enumerate(ABSENT):
        assert any(f"'absent-{i}'" in line and env in line and f"openai/absent-{i}" in line for line in warned), warned
    received = len(standin[1].state.requests)

    run = create_key(client, 1.0)
    refused = chat(client, run["key"], "absent-0", "What is 2 + 2?")
    assert refused.status_code == 502
    message = refused.json()["error"]["message"]
    assert "'absent-0'" in message and "no provider key" in message and message.endswith("Not billed.")
    assert ABSENT[0] not in message  # the operator's variable names stay in the operator's log
    assert len(standin[1].state.requests) == received  # the provider was never called
    assert spent(client, run["id"]) == (0.0, ["released"])


def test_an_upstream_failure_is_logged_for_the_operator_and_named_to_the_agent(
        make_gym: Any, standin: Any, teacher_secret: str, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "sk-wrong-" + teacher_secret[::-1]
    base = gym_config(standin[0])
    config = GymConfig.model_validate({"rollout": {"models": [
        *(m.model_dump() for m in base.rollout.models),
        {"name": "misconfigured", "litellm_model": "openai/misconfigured", "api_base": standin[0],
         "api_key_env": WRONG_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}]}})
    client = client_for(make_gym(config=config, secrets_={TEACHER_ENV: teacher_secret, WRONG_ENV: wrong}))
    run = create_key(client, 1.0)
    caplog.set_level(logging.WARNING, logger="rsigym.rollout")

    refused = chat(client, run["key"], "misconfigured", "What is 2 + 2?")
    assert refused.status_code == 502
    message = refused.json()["error"]["message"]
    assert message.startswith("model 'misconfigured': the provider refused the platform's credentials")
    assert message.endswith("Not billed.") and wrong not in refused.text
    logged = [r.getMessage() for r in caplog.records if "the provider failed" in r.getMessage()]
    assert len(logged) == 1 and "'misconfigured'" in logged[0] and "openai/misconfigured" in logged[0]
    assert "status 401" in logged[0] and wrong not in caplog.text
    assert spent(client, run["id"]) == (0.0, ["released"])
