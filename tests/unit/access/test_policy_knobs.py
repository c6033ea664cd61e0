"""The checklist of policy knobs: every knob of every section (access/sections.py) declares a
narrowing rule that keeps a child key within its parent, and the rule works.

For each knob a parent policy grants one value; a child wider in exactly that knob is refused
(naming the knob), a narrower one is accepted — through :func:`access.policy.narrowed`, what
access/keys.py runs when a child key is minted or its policy edited. A knob added with a rule
that lets a wider child through fails here; a new kind of rule fails until it has a probe below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from access.policy import NARROWING, FieldRulesWithin, Policy, PolicyKnobs, ServicePolicy, narrowed
from access.sections import SECTIONS, SPECS, SectionExtras
from kit.errors import PermissionDenied, Unprocessable, validated
from kit.policy_knobs import (
    Allowlist,
    Cap,
    Levels,
    NamedSubset,
    Narrowing,
    OnlyOff,
    PlatformGranted,
)
from tests.conftest import admin_headers, bearer, client_for, create_key


@dataclass(frozen=True)
class Probe:
    parent: Any
    wider: tuple[Any, ...]
    narrower: tuple[Any, ...]
    platform_may_widen: bool = False
    """A platform mint (an evaluation job's keys) may grant what the parent does not."""


def _levels(rule: Levels) -> Probe:
    return Probe(rule.levels[0], tuple(rule.levels[1:]), (rule.levels[0],))


PROBES: dict[type[Narrowing], Callable[[Any], Probe]] = {
    Cap: lambda rule: Probe(4, (5,), (4, 3, 0)),
    Allowlist: lambda rule: Probe(["m1", "m2"], (["m1", "m2", "m3"], ["m3"], "*"), (["m1", "m2"], ["m1"], []),
                                  platform_may_widen=rule.platform_may_widen),
    NamedSubset: lambda rule: Probe(["key_a", "key_b"], (["key_a", "key_c"],), (["key_a"], None)),
    OnlyOff: lambda rule: Probe(False, (True,), (False,)),
    PlatformGranted: lambda rule: Probe(False, (True,), (False,), platform_may_widen=True),
    Levels: _levels,
    FieldRulesWithin: lambda rule: Probe(
        {"x": {"range": [0, 1]}},
        ({"x": {"range": [0, 2]}}, {"x": "open"}, {"x": {"fixed": 2}}, {"x.y": {"fixed": 1}}),
        ({"x": {"range": [0.25, 0.5]}}, {"x": {"fixed": 1}}, {"x": {"allowed": [0, 1]}}, {"y": {"fixed": 3}}),
    ),
}
"""Per kind of narrowing rule: a parent's value, values wider than it, values within it."""


def _knobs_of(section: str) -> list[str]:
    return [*PolicyKnobs.model_fields, *SECTIONS[section].model_fields]


CHECKLIST = [(section, knob) for section in SECTIONS for knob in _knobs_of(section)]


def _probe(knob: str) -> Probe:
    rule = NARROWING[knob]
    if type(rule) not in PROBES:
        pytest.fail(f"knob {knob!r} narrows by {type(rule).__name__}, which has no probe in PROBES: add what a "
                    "parent's value, a wider and a narrower child's look like")
    return PROBES[type(rule)](rule)


def _policy(section: str, knob: str, value: Any) -> Policy:
    return Policy.model_validate({"services": {section: {knob: value}}})


def _param(knob: str, section: str, value: Any) -> str:
    """What a refusal names: the knob, or for field rules the rule's path."""
    return next(iter(value)) if knob == "fields" else f"services.{section}.{knob}"


def test_every_knob_declares_one_narrowing_rule_and_every_section_its_knobs() -> None:
    assert set(NARROWING) == set(ServicePolicy.model_fields)
    for spec in SPECS:
        assert issubclass(SectionExtras, spec.policy), f"{spec.name}'s policy extras are not in SectionExtras"
    assert "agent" in SECTIONS  # not a service: the research agent's own model, limited by its keys


@pytest.mark.parametrize(("section", "knob"), CHECKLIST)
def test_a_child_cannot_widen_a_knob(section: str, knob: str) -> None:
    probe = _probe(knob)
    parent = _policy(section, knob, probe.parent)
    for value in probe.wider:
        with pytest.raises(PermissionDenied) as refused:
            narrowed(_policy(section, knob, value), [parent])
        assert refused.value.param == _param(knob, section, value), (knob, value)
        with pytest.raises(PermissionDenied):  # an ancestor further up holds it too
            narrowed(_policy(section, knob, value), [parent, Policy.model_validate({"services": {section: {}}})])
    for value in probe.narrower:
        assert getattr(narrowed(_policy(section, knob, value), [parent]).services[section], knob) == \
            getattr(_policy(section, knob, value).services[section], knob)


@pytest.mark.parametrize(("section", "knob"), CHECKLIST)
def test_a_platform_mint_widens_only_what_the_platform_grants(section: str, knob: str) -> None:
    probe = _probe(knob)
    parent = _policy(section, knob, probe.parent)
    for value in probe.wider:
        if probe.platform_may_widen:
            narrowed(_policy(section, knob, value), [parent], platform=True)
        else:
            with pytest.raises(PermissionDenied):
                narrowed(_policy(section, knob, value), [parent], platform=True)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_child_that_leaves_a_cap_out_gets_its_parents(section: str) -> None:
    for knob in (k for k, rule in NARROWING.items() if isinstance(rule, Cap)):
        child = narrowed(Policy.model_validate({"services": {section: {}}}), [_policy(section, knob, 4)])
        assert getattr(child.services[section], knob) == 4


def test_an_unknown_section_or_knob_is_refused_naming_it() -> None:
    with pytest.raises(Unprocessable) as section:
        validated(Policy, {"services": {"rollout": {}, "bogus": {}}}, what="policy", prefix="policy.")
    assert section.value.param == "policy.services.bogus"
    assert section.value.message == ("invalid policy: policy.services.bogus: unknown policy section 'bogus'; the "
                                     f"sections are {', '.join(sorted(SECTIONS))}")
    with pytest.raises(Unprocessable) as knob:
        validated(Policy, {"services": {"rollout": {"modles": []}}}, what="policy", prefix="policy.")
    assert knob.value.param == "policy.services.rollout.modles"
    assert knob.value.message == "invalid policy: policy.services.rollout.modles: Extra inputs are not permitted"


def test_the_api_refuses_an_unknown_section_in_the_standard_shape(gym: Any) -> None:
    client = client_for(gym)
    run = create_key(client, 1.0)
    for response in (
        client.post("/admin/v1/keys", json={"budget_usd": 1.0, "policy": {"services": {"rolout": {}}}},
                    headers=admin_headers()),
        client.patch(f"/admin/v1/keys/{run['id']}", json={"policy": {"services": {"rolout": {}}}},
                     headers=admin_headers()),
        client.post("/v1/keys", json={"name": "worker", "policy": {"services": {"rolout": {}}}},
                    headers=bearer(run["key"])),
    ):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "unknown policy section 'rolout'" in error["message"]
        assert "the sections are agent, evaluation, inference, records, rollout, sandbox, training" in error["message"]
        assert error["param"] == "policy.services.rolout"
    assert client.get(f"/admin/v1/keys/{run['id']}", headers=admin_headers()).json()["policy"] == run["policy"]
