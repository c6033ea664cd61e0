"""A policy rule judges the value that would run, not the absence of a field (issue 16, item 3).

The attack: a key whose rule says ``max_tokens`` in ``allowed = [256, 512]`` (or ``temperature``
in ``range = [0, 0.5]``, a sandbox ``timeout`` of at most 60 s) sent the request *without* the
field, the rule found nothing to check, and the service ran with its own default — 1024 tokens,
temperature 1, a 300 s sandbox. The gateway now gives every field a range/allowed rule constrains
and the body leaves out its effective value (the service's default, bounded by the rules), and
refuses the call when that default cannot be told. The first test covers each service's
operation directly; the others play the agent through the real gateway and check what ran.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from access.policy import Policy, apply_chain, fill_left_out
from kit.config import GymConfig
from kit.errors import PermissionDenied
from ops.builder import Gym, service_modules
from tests.conftest import bearer, client_for, create_key

CHAT = {"model": "teacher", "messages": [{"role": "user", "content": "Write a long essay."}]}


def _effective(service: str, op_name: str, rules: dict[str, Any], body: dict[str, Any],
               parent_rules: dict[str, Any] | None = None) -> dict[str, Any]:
    op = next(o for o in service_modules()[service].SPEC.operations if o.name == op_name)
    chain = [Policy.model_validate({"services": {service: {"fields": r}}}) for r in (parent_rules, rules) if r]
    config = GymConfig()
    filled = fill_left_out(chain, service, body, lambda path: op.default_of(path, body, config))
    return apply_chain(chain, service, filled, model_field=None)


@pytest.mark.parametrize("service", ["rollout", "inference"])
def test_chat_fields_left_out_take_their_default_within_the_rules(service: str) -> None:
    config = GymConfig()
    default = (config.inference if service == "inference" else config.rollout).default_max_tokens
    out = _effective(service, "chat.completions", {"max_tokens": {"allowed": [16, 32]}}, dict(CHAT))
    assert out["max_tokens"] == 32 < default  # the allowed value nearest the default, not the default
    assert _effective(service, "chat.completions", {"max_tokens": {"range": [1, 100_000]}}, dict(CHAT))[
        "max_tokens"] == default  # a default the rule admits is kept, and sent explicitly
    assert _effective(service, "chat.completions", {"temperature": {"range": [0, 0.5]}}, dict(CHAT))[
        "temperature"] == 0.5
    assert _effective(service, "chat.completions", {"top_p": {"allowed": [0.9, 0.95]}}, dict(CHAT))["top_p"] == 0.95
    assert _effective(service, "chat.completions", {"temperature": {"fixed": 0.0}}, dict(CHAT))["temperature"] == 0.0
    # parent and child rules both hold: the child's narrower rule wins, within the parent's
    out = _effective(service, "chat.completions", {"max_tokens": {"allowed": [8, 16]}}, dict(CHAT),
                     parent_rules={"max_tokens": {"range": [1, 64]}})
    assert out["max_tokens"] == 16
    # a field the body gives is judged as given, never replaced
    with pytest.raises(PermissionDenied, match="max_tokens"):
        _effective(service, "chat.completions", {"max_tokens": {"allowed": [16, 32]}}, {**CHAT, "max_tokens": 33})
    # a field whose default means "none" cannot be checked: the agent must give it
    with pytest.raises(PermissionDenied, match="seed is required by this key's policy"):
        _effective(service, "chat.completions", {"seed": {"allowed": [1, 2]}}, dict(CHAT))


def test_training_and_sandbox_fields_left_out_take_their_default_within_the_rules() -> None:
    job = {"datasets": ["ds_x"], "base_model": "tiny", "steps": 10}
    out = _effective("training", "jobs.create", {"learning_rate": {"range": [1e-5, 5e-4]}, "lora.rank": {"allowed": [4, 8]},
                                                 "batch_size": {"range": [1, 64]}}, job)
    assert out["learning_rate"] == 5e-4 and out["lora"] == {"rank": 8} and out["batch_size"] == 16
    with pytest.raises(PermissionDenied, match="epochs is required"):  # no default: it would be derived from steps
        _effective("training", "jobs.create", {"epochs": {"range": [0.1, 1]}}, job)
    created = _effective("sandbox", "sandboxes.create", {"timeout": {"range": [1, 60]},
                                                          "templateID": {"allowed": ["base"]}}, {})
    assert created == {"timeout": 60, "templateID": "base"}


def test_a_chat_without_max_tokens_runs_within_the_rule(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    child = client.post("/v1/keys", headers=bearer(run["key"]), json={"name": "sampler", "policy": {"services": {
        "rollout": {"max_concurrency": 4, "fields": {"max_tokens": {"range": [1, 8]},
                                                     "temperature": {"range": [0, 0.2]}}}}}})
    assert child.status_code == 201, child.text
    r = client.post("/rollout/v1/chat/completions", json=CHAT, headers=bearer(child.json()["key"]))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 8  # the essay was cut where the rule says


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_sandbox_created_without_a_timeout_lives_no_longer_than_the_rule(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    child = client.post("/v1/keys", headers=bearer(run["key"]), json={"name": "short", "policy": {"services": {
        "sandbox": {"max_concurrency": 1, "fields": {"timeout": {"range": [1, 60]}}}}}})
    assert child.status_code == 201, child.text
    key = child.json()["key"]
    r = client.post("/sandbox/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": key})
    assert r.status_code == 201, r.text
    sandbox_id = r.json()["sandboxID"]
    try:
        view = client.get(f"/sandbox/sandboxes/{sandbox_id}", headers={"X-API-Key": key}).json()
        lifetime = (datetime.fromisoformat(view["endAt"]) - datetime.fromisoformat(view["startedAt"])).total_seconds()
        assert lifetime <= 60  # not the service's 300 s default
    finally:
        client.delete(f"/sandbox/sandboxes/{sandbox_id}", headers={"X-API-Key": key})
