"""A policy rule cannot be side-stepped by another spelling of its field (security issue, item 4).

The attack: a rule on sandbox ``templateID`` let ``template_id`` through (the schema accepts both
under ``populate_by_name``), and a rule on ``max_tokens`` let ``max_completion_tokens`` through.
The gateway now rewrites every body to one spelling per field of the operation's schema before
any policy matches. The first test enumerates every service request schema's alternative
spellings and proves each one is covered; the others play the agent through the real gateway.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from access.policy import Policy, apply_chain
from gateway.admin import parse_policy
from kit.canonical import canonical_body
from kit.config import GymConfig, SandboxConfig, SandboxTemplate
from kit.errors import PermissionDenied, Unprocessable
from ops.builder import Gym, service_modules
from tests.conftest import admin_headers, bearer, client_for, create_key, gym_config

FIXED, OTHER = "value-the-policy-fixes", "value-the-agent-wants"


def _nested(path: str, value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {}
    *parents, leaf = path.split(".")
    inner = body
    for part in parents:
        inner = inner.setdefault(part, {})
    inner[leaf] = value
    return body


def _get(body: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        body = body[part]
    return body


def test_every_alternative_spelling_of_every_request_schema_is_covered() -> None:
    specs = {name: module.SPEC for name, module in service_modules().items()}
    covered: set[tuple[str, str, str]] = set()
    for service, spec in specs.items():
        for op in spec.operations:
            if not op.json_body:
                continue
            assert op.schema is not None and op.spellings is not None, f"{service} {op.path} declares no schema"
            for canonical, alternative in op.spellings.alternatives():
                policy = Policy.model_validate({"services": {service: {"fields": {canonical: {"fixed": FIXED}}}}})
                # The other spelling with another value is refused by the rule on the canonical one …
                with pytest.raises(PermissionDenied):
                    apply_chain([policy], service, canonical_body(_nested(alternative, OTHER), op.spellings),
                                model_field=None)
                # … with the same value it passes, and only the canonical spelling reaches the service.
                out = apply_chain([policy], service, canonical_body(_nested(alternative, FIXED), op.spellings),
                                  model_field=None)
                assert _get(out, canonical) == FIXED
                with pytest.raises(KeyError):
                    _get(out, alternative)
                # Both spellings at once with different values: refused outright.
                both = {**_nested(canonical, FIXED), **_nested(alternative, OTHER)} if "." not in canonical else None
                if both is not None:
                    with pytest.raises(Unprocessable):
                        canonical_body(both, op.spellings)
                # A rule written on the other spelling is refused when the policy is made.
                with pytest.raises(Unprocessable, match=canonical.rsplit(".", 1)[-1]):
                    parse_policy({"services": {service: {"fields": {alternative: {"fixed": FIXED}}}}}, specs)
                covered.add((service, canonical, alternative))
    print(f"\n{len(covered)} alternative spellings covered: {sorted(covered)}")
    for known in [("sandbox", "templateID", "template_id"), ("sandbox", "envVars", "env_vars"),
                  ("rollout", "max_tokens", "max_completion_tokens"), ("rollout", "max_tokens", "max_output_tokens"),
                  ("inference", "max_tokens", "max_completion_tokens")]:
        assert known in covered


def _two_templates(api_base: str) -> GymConfig:
    config = gym_config(api_base)
    return config.model_copy(update={"sandbox": SandboxConfig(templates=[
        SandboxTemplate(name="base"), SandboxTemplate(name="big", memory_mb=4096, usd_per_hour=5.0)])})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_rule_on_templateID_holds_against_template_id(make_gym: Callable[..., Gym], standin: Any) -> None:
    gym = make_gym(config=_two_templates(standin[0]))
    client = client_for(gym)
    run = create_key(client, 1.0)
    worker = client.post("/v1/keys", headers=bearer(run["key"]), json={"name": "worker", "policy": {"services": {
        "sandbox": {"max_concurrency": 2, "fields": {"templateID": {"allowed": ["base"]}}}}}})
    assert worker.status_code == 201, worker.text
    key = worker.json()["key"]
    for body in ({"template_id": "big", "timeout": 30}, {"templateID": "big", "timeout": 30},
                 {"templateID": "base", "template_id": "big", "timeout": 30}):
        r = client.post("/sandbox/v2/sandboxes", json=body, headers={"X-API-Key": key})
        assert r.status_code in (403, 422), (body, r.text)
    listed = client.get("/sandbox/v1/sandboxes", headers={"X-API-Key": run["key"]})
    assert listed.status_code == 200 and listed.json()["data"] == []  # no "big" sandbox was ever started
    ok = client.post("/sandbox/v2/sandboxes", json={"template_id": "base", "timeout": 30}, headers={"X-API-Key": key})
    assert ok.status_code == 201 and ok.json()["templateID"] == "base"
    client.delete(f"/sandbox/sandboxes/{ok.json()['sandboxID']}", headers={"X-API-Key": key})


def test_a_rule_on_max_tokens_holds_against_max_completion_tokens(make_gym: Callable[..., Gym]) -> None:
    client = client_for(make_gym())
    run = create_key(client, 1.0)
    child = client.post("/v1/keys", headers=bearer(run["key"]), json={"name": "sampler", "policy": {"services": {
        "rollout": {"max_concurrency": 4, "fields": {"max_tokens": {"range": [1, 8]}}}}}})
    assert child.status_code == 201, child.text
    ask = {"model": "teacher", "messages": [{"role": "user", "content": "Write a long essay."}]}
    for extra in ({"max_completion_tokens": 400}, {"max_tokens": 400},
                  {"max_tokens": 8, "max_completion_tokens": 400}):
        r = client.post("/rollout/v1/chat/completions", json={**ask, **extra}, headers=bearer(child.json()["key"]))
        assert r.status_code in (403, 422), (extra, r.text)
        assert r.json()["error"]["param"] in ("max_tokens",), r.text
    # The Responses API names the cap max_output_tokens: the same rule binds it.
    for extra in ({"max_output_tokens": 400}, {"max_tokens": 8, "max_output_tokens": 400}):
        r = client.post("/rollout/v1/responses", json={"model": "teacher", "input": "Write a long essay.", **extra},
                        headers=bearer(child.json()["key"]))
        assert r.status_code in (403, 422) and r.json()["error"]["param"] == "max_tokens", (extra, r.text)
    ledger = client.get(f"/admin/v1/keys/{run['id']}/ledger", headers=admin_headers()).json()["data"]
    assert ledger == []  # nothing reserved, nothing sent to the provider
    fine = client.post("/rollout/v1/chat/completions", json={**ask, "max_completion_tokens": 8},
                       headers=bearer(child.json()["key"]))
    assert fine.status_code == 200 and fine.json()["usage"]["completion_tokens"] <= 8
