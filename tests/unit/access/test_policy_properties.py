"""Property-based tests (hypothesis) for the policy matcher in ``access/policy.py``.

The properties pin down what a per-key policy promises:

* fixed fields cannot be overridden, by any value whose canonical JSON differs;
* allowed values cannot be escaped by type tricks (``"16"`` vs ``16``, ``16.0`` vs ``16``,
  ``true`` vs ``1``, ``[16]``, ``{"value": 16}``, extra keys inside an allowed object);
* ranges admit only finite, non-boolean numbers within bounds;
* extra fields never change the verdict on constrained fields, while dotted alias keys
  (``{"lora.rank": 64}``) and non-objects on a constrained path are refused;
* ``apply`` never mutates its input;
* a key chain is applied root first, and a child that passed ``assert_within`` can never get
  a body past its own matcher that its parent would refuse;
* the model allowlist refuses non-string models;
* ``FieldRule.within`` is sound: ``a.within(b)`` implies every value ``a`` admits, ``b`` admits.

Paths are drawn from a tiny alphabet of segments so that rules, bodies and aliases collide often.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from access.policy import FieldRule, Policy, ServicePolicy, apply_chain, canonical
from kit.errors import PermissionDenied

# Strategy factories are cached (functools.cache): building a recursive strategy afresh on every
# draw makes hypothesis re-validate it each time, which costs far more than the tests themselves.
# Budget: the whole file in well under 20 s on two cores. Single-rule properties are cheap and get
# many examples; whole-policy properties (random policies, bodies, chains) get fewer.
TARGETED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WHOLE_POLICY = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)

SEGMENTS = ("lora", "rank", "alpha")
"""Path segments of constrained fields; small on purpose so paths overlap and collide."""
SERVICES = ("training", "rollout", "evaluation")
MODELS = ("teacher", "student", "judge")
EXTRA_KEYS = ("x_note", "x_tag", "x_meta")
"""Names of extra fields; disjoint from SEGMENTS and free of dots, so they never collide."""
MISSING = object()


# -- JSON values ---------------------------------------------------------------------------


@functools.cache
def finite_floats() -> st.SearchStrategy[float]:
    """Finite floats, biased towards the ones that look like ints (16.0) and to -0.0."""
    return st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, -0.0, 1.0, 16.0, 0.5, 1e-4, 1e16]),
    )


@functools.cache
def json_ints() -> st.SearchStrategy[int]:
    """Ints, including the famous ones (0, 1, 16) and ones beyond 64 bits."""
    return st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 16, 64]))


@functools.cache
def json_scalars() -> st.SearchStrategy[Any]:
    """null, booleans, ints, finite floats (incl. -0.0) and short strings (incl. numeric ones)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        json_ints(),
        finite_floats(),
        st.text(max_size=4),
        st.sampled_from(["16", "1", "true", "null", "16.0", "teacher"]),
    )


@functools.cache
def json_keys() -> st.SearchStrategy[str]:
    """Object keys for random JSON: path segments, dotted aliases and a few neutral names."""
    return st.sampled_from(SEGMENTS + ("value", "v", "lora.rank", "rank.alpha"))


@functools.cache
def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Arbitrary plain JSON: scalars, lists and nested objects."""
    return st.recursive(
        json_scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(json_keys(), inner, max_size=3),
        ),
        max_leaves=max_leaves,
    )


@functools.cache
def hostile_values() -> st.SearchStrategy[Any]:
    """Values JSON parsers can produce that plain JSON comparison struggles with: NaN, inf, huge ints."""
    return st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400)])


@functools.cache
def any_values() -> st.SearchStrategy[Any]:
    """Plain JSON most of the time, hostile values some of the time."""
    return st.one_of(json_values(), hostile_values())


@functools.cache
def non_objects() -> st.SearchStrategy[Any]:
    """Any JSON value that is not an object: scalars and lists (even lists of objects)."""
    return st.one_of(json_scalars(), st.lists(json_values(max_leaves=3), max_size=3))


def type_trick_variants(value: Any) -> list[Any]:
    """Values that look like ``value`` but are a different JSON value (mostly).

    Some variants may coincide canonically with ``value``; tests decide by canonical text.
    """
    out: list[Any] = [json.dumps(value, default=str), [value], {"value": value}, {"v": value}, None]
    if isinstance(value, str):
        try:
            out.append(json.loads(value))
        except ValueError:
            pass
    if type(value) is bool:
        out += [int(value), float(value), str(value).lower()]
    if type(value) is int:
        out += [str(value)]
        if abs(value) < 2**53:
            out.append(float(value))
        if value in (0, 1):
            out.append(bool(value))
    if type(value) is float:
        if math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
            out.append(int(value))
        if value == 0:
            out.append(-value)  # -0.0 for 0.0 and vice versa
        if value in (0.0, 1.0):
            out.append(bool(value))
    if isinstance(value, list):
        out += [value[:1], value + value, list(reversed(value)), {"0": value[0]} if value else {}]
    if isinstance(value, dict):
        out += [{**value, "x_extra": 1}, {}, list(value.values())]
        for k, v in value.items():
            out.append({**value, k: [v]})
    if isinstance(value, (dict, list)):
        out.append(retyped(value))
    return out


def retyped(value: Any) -> Any:
    """``value`` with every number and bool swapped for its look-alike (1 -> 1.0, 2.0 -> 2, True -> 1).

    Python's ``==`` calls the result equal to ``value``; canonical JSON does not.
    """
    if isinstance(value, dict):
        return {k: retyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [retyped(v) for v in value]
    if type(value) is bool:
        return int(value)
    if type(value) is int and abs(value) < 2**53:
        return float(value)
    if type(value) is float and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


# -- paths and rules -----------------------------------------------------------------------


@functools.cache
def field_paths(min_segments: int = 1) -> st.SearchStrategy[str]:
    """Dotted field paths of 1..3 segments, e.g. ``lora.rank``."""
    return st.lists(st.sampled_from(SEGMENTS), min_size=min_segments, max_size=3).map(".".join)


@functools.cache
def range_bounds() -> st.SearchStrategy[int | float]:
    """Numbers usable as range bounds (finite ints and floats, never bools)."""
    return st.one_of(
        st.integers(min_value=-1000, max_value=1000),
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
        st.sampled_from([0, 1, 16, 0.0, -0.0, 1.0]),
    )


@st.composite
def range_rules(draw: st.DrawFn) -> FieldRule:
    """``{"range": [lo, hi]}`` with lo <= hi, either bound possibly null."""
    lo, hi = sorted([draw(range_bounds()), draw(range_bounds())])
    if draw(st.booleans()):
        lo = None
    if draw(st.booleans()):
        hi = None
    return FieldRule.model_validate({"range": [lo, hi]})


@functools.cache
def segment_objects() -> st.SearchStrategy[dict[str, Any]]:
    """Objects keyed by path segments ({"rank": 64}), so a fixed object lands on other rules' paths."""
    return st.recursive(
        st.dictionaries(st.sampled_from(SEGMENTS), json_scalars(), min_size=1, max_size=2),
        lambda inner: st.dictionaries(
            st.sampled_from(SEGMENTS), st.one_of(json_scalars(), inner), min_size=1, max_size=2
        ),
        max_leaves=4,
    )


@functools.cache
def fixed_rules() -> st.SearchStrategy[FieldRule]:
    """``{"fixed": v}`` for any plain JSON v (often an object keyed by path segments)."""
    return st.one_of(json_values(), segment_objects()).map(lambda v: FieldRule.model_validate({"fixed": v}))


@functools.cache
def allowed_rules() -> st.SearchStrategy[FieldRule]:
    """``{"allowed": [v, ...]}`` with 1..4 plain JSON values."""
    return st.lists(json_values(max_leaves=4), min_size=1, max_size=4).map(
        lambda vs: FieldRule.model_validate({"allowed": vs})
    )


@functools.cache
def field_rules() -> st.SearchStrategy[FieldRule]:
    """Any of the four rule forms: open, fixed, allowed, range."""
    return st.one_of(st.just(FieldRule.model_validate("open")), fixed_rules(), allowed_rules(), range_rules())


def rule_values(rule: FieldRule) -> list[Any]:
    """The values a rule talks about (its fixed value, its allowed list, its bounds and a midpoint)."""
    if rule.kind == "fixed":
        return [rule.arg]
    if rule.kind == "allowed":
        return list(rule.arg)
    if rule.kind == "range":
        lo, hi = rule.arg
        vals = [b for b in (lo, hi) if b is not None]
        if lo is not None and hi is not None:
            vals.append(lo + (hi - lo) / 2)
        return vals + [b - 1 for b in vals] + [b + 1 for b in vals]
    return []


@st.composite
def values_for(draw: st.DrawFn, rules: list[FieldRule]) -> Any:
    """A value aimed at ``rules``: one they name, a type-trick variant of one, or anything at all."""
    named = [v for r in rules for v in rule_values(r)]
    choices = [any_values()]
    if named:
        choices.append(st.sampled_from(named))
        variants = [t for v in named for t in type_trick_variants(v)]
        choices.append(st.sampled_from(variants))
    return draw(st.one_of(*choices))


@st.composite
def narrowed_rules(draw: st.DrawFn, parent: FieldRule) -> FieldRule:
    """A rule that should be ``within(parent)`` (a child key's narrowing of ``parent``)."""
    if parent.kind == "open":
        return draw(field_rules())
    if parent.kind == "fixed":
        return parent
    if parent.kind == "allowed":
        subset = draw(st.lists(st.sampled_from(parent.arg), min_size=1, max_size=len(parent.arg)))
        return FieldRule.model_validate(draw(st.sampled_from([{"allowed": subset}, {"fixed": subset[0]}])))
    lo, hi = parent.arg

    def clamp(x: float) -> float:
        if lo is not None:
            x = max(x, lo)
        if hi is not None:
            x = min(x, hi)
        return x

    x, y = sorted([clamp(draw(range_bounds())), clamp(draw(range_bounds()))])
    form = draw(st.sampled_from([{"range": [x, y]}, {"fixed": x}, {"allowed": [x, y]}]))
    return FieldRule.model_validate(form)


# -- policies and bodies -------------------------------------------------------------------


@functools.cache
def model_lists() -> st.SearchStrategy[Any]:
    """A model allowlist: ``"*"`` or a list of model names."""
    return st.one_of(st.just("*"), st.lists(st.sampled_from(MODELS), unique=True, max_size=3))


@st.composite
def related_paths(draw: st.DrawFn, paths: list[str]) -> str:
    """A path near one of ``paths`` (a prefix, an extension or a sibling of it), or any path."""
    if not paths or draw(st.booleans()):
        return draw(field_paths())
    parts = draw(st.sampled_from(paths)).split(".")
    how = draw(st.sampled_from(["prefix", "extension", "sibling"]))
    if how == "prefix" and len(parts) > 1:
        parts = parts[: draw(st.integers(min_value=1, max_value=len(parts) - 1))]
    elif how == "extension" and len(parts) < 3:
        parts = parts + [draw(st.sampled_from(SEGMENTS))]
    else:
        parts = parts[:-1] + [draw(st.sampled_from(SEGMENTS))]
    return ".".join(parts)


@st.composite
def field_maps(
    draw: st.DrawFn, rules: st.SearchStrategy[FieldRule], max_size: int = 4, near: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Up to ``max_size`` rules (as JSON) on paths that often nest in one another or in ``near``.

    Overlapping paths (``lora`` and ``lora.rank``) are where fills and checks can interfere.
    """
    fields: dict[str, Any] = {}
    for _ in range(draw(st.integers(min_value=0, max_value=max_size))):
        fields[draw(related_paths(list(near) + list(fields)))] = draw(rules).root
    return fields


@functools.cache
def service_policies() -> st.SearchStrategy[dict[str, Any]]:
    """The JSON of one service's policy: a model allowlist and up to four field rules."""
    return st.fixed_dictionaries({"models": model_lists(), "fields": field_maps(field_rules())})


@functools.cache
def policies() -> st.SearchStrategy[Policy]:
    """A policy granting 1..3 services, each with its own rules."""
    return st.dictionaries(st.sampled_from(SERVICES), service_policies(), min_size=1, max_size=3).map(
        lambda services: Policy.model_validate({"services": services})
    )


def single_rule_policy(path: str, rule: FieldRule, service: str = "training") -> Policy:
    """A policy whose one service has exactly one field rule (so refusals name that rule)."""
    return Policy.model_validate({"services": {service: {"fields": {path: rule.root}}}})


def set_keys(body: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set ``value`` under nested ``keys``, creating (or replacing non-object) containers on the way.

    Keys are taken literally, so a key may itself contain dots (a dotted alias).
    """
    container = body
    for key in keys[:-1]:
        if not isinstance(container.get(key), dict):
            container[key] = {}
        container = container[key]
    container[keys[-1]] = value


def set_path(body: dict[str, Any], path: str, value: Any) -> None:
    """Set ``value`` at dotted ``path`` (``lora.rank`` -> body["lora"]["rank"])."""
    set_keys(body, path.split("."), value)


def get_path(body: dict[str, Any], path: str) -> Any:
    """The value at dotted ``path``, or MISSING; every container on the way must be an object."""
    container: Any = body
    for part in path.split("."):
        assert isinstance(container, dict), f"non-object on the way to {path}: {container!r}"
        if part not in container:
            return MISSING
        container = container[part]
    return container


def object_nodes(value: Any, at: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every object reachable from ``value`` through objects only, with its key path."""
    if not isinstance(value, dict):
        return []
    out = [(at, value)]
    for k, v in value.items():
        out += object_nodes(v, at + (k,))
    return out


def clear_of_rules(at: tuple[str, ...], paths: list[str]) -> bool:
    """Is the object at ``at`` outside every rule's value (no rule path is a prefix of, or equal to, it)?"""
    return not any(at[: len(p.split("."))] == tuple(p.split(".")) for p in paths)


Placement = tuple[tuple[str, ...], str, Any]
"""An extra field: the key path of the object it goes into, its key and its value."""


def place_extras(body: dict[str, Any], paths: list[str], extras: list[tuple[int, str, Any]]) -> list[Placement]:
    """Where the extra fields go: (object's key path, extra key, value), only in objects no rule constrains."""
    nodes = [at for at, _ in object_nodes(body) if clear_of_rules(at, paths)]
    placed: dict[tuple[tuple[str, ...], str], Any] = {}
    for index, key, value in extras:
        at = nodes[index % len(nodes)]
        placed.setdefault((at, key), value)
    return [(at, key, value) for (at, key), value in placed.items()]


def put_extras(body: dict[str, Any], placements: list[Placement]) -> dict[str, Any]:
    """A copy of ``body`` with the placed extra fields added (an existing key is left alone)."""
    out = copy.deepcopy(body)
    for at, key, value in placements:
        node = out
        for part in at:
            node = node[part]
        node.setdefault(key, copy.deepcopy(value))
    return out


def add_extras(body: dict[str, Any], paths: list[str], extras: list[tuple[int, str, Any]]) -> dict[str, Any]:
    """A copy of ``body`` with extra keys added to objects that no rule constrains."""
    return put_extras(body, place_extras(body, paths, extras))


@functools.cache
def extras_lists() -> st.SearchStrategy[list[tuple[int, str, Any]]]:
    """Extra fields to add: (which free object, which extra key, what value)."""
    return st.lists(
        st.tuples(st.integers(min_value=0, max_value=50), st.sampled_from(EXTRA_KEYS), json_values(max_leaves=4)),
        max_size=4,
    )


@st.composite
def bodies_for(draw: st.DrawFn, rules: dict[str, FieldRule]) -> dict[str, Any]:
    """A request body aimed at ``rules``.

    Each constrained path is left out, set to a value aimed at its rule, blocked by a non-object
    part way, or smuggled in as a dotted alias key; then random extra fields are sprinkled over
    objects no rule constrains.
    """
    body: dict[str, Any] = draw(st.dictionaries(json_keys(), json_values(max_leaves=3), max_size=2))
    for path, rule in rules.items():
        parts = path.split(".")
        action = draw(st.sampled_from(["absent", "absent", "value", "value", "non-object", "alias"]))
        if action == "value":
            set_path(body, path, draw(values_for([rule])))
        elif action == "non-object" and len(parts) > 1:
            cut = draw(st.integers(min_value=1, max_value=len(parts) - 1))
            set_path(body, ".".join(parts[:cut]), draw(non_objects()))
        elif action == "alias" and len(parts) > 1:
            cut = draw(st.integers(min_value=0, max_value=len(parts) - 2))
            # e.g. {"lora.rank": v} (cut 0) or {"lora": {"rank.alpha": v}} (cut 1)
            set_keys(body, parts[:cut] + [".".join(parts[cut:])], draw(values_for([rule])))
    if draw(st.booleans()):
        body["model"] = draw(st.one_of(st.sampled_from(MODELS), json_values(max_leaves=3)))
    return add_extras(body, list(rules), draw(extras_lists()))


@st.composite
def policy_service_body(draw: st.DrawFn) -> tuple[Policy, str, dict[str, Any]]:
    """A random policy, one of its services, and a body aimed at that service's rules."""
    policy = draw(policies())
    service = draw(st.sampled_from(sorted(policy.services)))
    return policy, service, draw(bodies_for(policy.services[service].fields))


# -- outcome helpers -----------------------------------------------------------------------


def outcome(fn, *args, **kwargs) -> tuple[str, Any]:
    """("ok", result) or ("refused", param); anything but PermissionDenied propagates (a 500)."""
    try:
        return "ok", fn(*args, **kwargs)
    except PermissionDenied as e:
        return "refused", e.param


def same_json(a: Any, b: Any) -> bool:
    """Structural equality that tells 1 from True from 1.0, -0.0 from 0.0, and NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def containers(value: Any) -> list[int]:
    """ids of every dict and list inside ``value``."""
    if isinstance(value, dict):
        return [id(value)] + [i for v in value.values() for i in containers(v)]
    if isinstance(value, list):
        return [id(value)] + [i for v in value for i in containers(v)]
    return []


def is_admissible_number(value: Any, lo: Any, hi: Any) -> bool:
    """The range oracle: a finite int/float (never a bool) within [lo, hi]."""
    if type(value) not in (int, float):
        return False
    if type(value) is float and not math.isfinite(value):
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


# -- 1. fixed fields -----------------------------------------------------------------------


def candidates(rule: FieldRule, drawn: list[Any]) -> list[Any]:
    """Values to offer against ``rule``: the ones it names, every type-trick variant of those, and ``drawn``."""
    named = rule_values(rule)
    return named + [t for v in named for t in type_trick_variants(v)] + drawn


@TARGETED
@given(
    path=field_paths(),
    fixed=st.one_of(json_scalars(), json_values(), segment_objects()),
    drawn=st.lists(any_values(), max_size=3),
    extras=extras_lists(),
)
def test_fixed_field_cannot_be_overridden(path, fixed, drawn, extras):
    """A fixed field is filled in when absent, kept when canonically equal, refused otherwise.

    Every type-trick variant of the fixed value is offered ("16", 16.0, true, [16], {"value": 16}, ...).
    """
    rule = FieldRule.model_validate({"fixed": fixed})
    policy = single_rule_policy(path, rule)
    for value in [MISSING] + candidates(rule, drawn):
        body: dict[str, Any] = {}
        if value is not MISSING:
            set_path(body, path, value)
        body = add_extras(body, [path], extras)

        verdict, result = outcome(policy.apply, "training", body)

        if value is MISSING or canonical(value) == canonical(fixed):
            assert verdict == "ok", f"{body!r} refused at {result!r}"
            got = get_path(result, path)
            assert canonical(got) == canonical(fixed)
            if isinstance(fixed, (dict, list)) and value is MISSING:
                assert got is not rule.arg, "the filled value aliases the policy's own value"
        else:
            assert verdict == "refused", f"{value!r} overrode fixed {fixed!r}: {result!r}"
            assert result == path


@WHOLE_POLICY
@given(case=policy_service_body())
def test_accepted_bodies_satisfy_every_rule_of_random_policies(case):
    """Whatever a random policy accepts holds every fixed value and passes every rule and the allowlist."""
    policy, service, body = case
    verdict, result = outcome(policy.apply, service, body)
    if verdict != "ok":
        return
    rules = policy.services[service]
    for path, rule in rules.fields.items():
        got = get_path(result, path)
        if rule.kind == "fixed":
            assert got is not MISSING and canonical(got) == canonical(rule.arg), (path, got)
        if got is not MISSING:
            assert rule.admits(got), f"{path} = {got!r} escapes {rule.describe()} in {result!r}"
    if "model" in result:
        assert rules.allows_model(result["model"])


@st.composite
def overlapping_rule_pairs(draw: st.DrawFn) -> list[tuple[str, FieldRule]]:
    """Two rules on nesting paths (``lora`` and ``lora.rank``), at least one fixed, in random order."""
    outer = draw(field_paths().filter(lambda p: p.count(".") < 2))
    inner = outer + "." + ".".join(draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=2 - outer.count("."))))
    fixed_path = draw(st.sampled_from([outer, inner]))
    other_path = inner if fixed_path == outer else outer
    fixed = draw(fixed_rules())
    if fixed_path == outer and draw(st.booleans()):
        # A fixed object that reaches down to the inner path.
        value: Any = draw(json_values(max_leaves=3))
        for part in reversed(inner.split(".")[outer.count(".") + 1 :]):
            value = {part: value}
        fixed = FieldRule.model_validate({"fixed": value})
    pairs = [(fixed_path, fixed), (other_path, draw(field_rules()))]
    return pairs if draw(st.booleans()) else pairs[::-1]


@TARGETED
@given(pairs=overlapping_rule_pairs(), data=st.data())
def test_fills_never_break_another_rule_of_the_same_policy(pairs, data):
    """A fixed fill on lora (or lora.rank) cannot slip a value past a rule on lora.rank (or lora)."""
    policy = Policy.model_validate({"services": {"training": {"fields": {p: r.root for p, r in pairs}}}})
    rules = dict(pairs)
    for body in ({}, data.draw(bodies_for(rules), label="body")):
        verdict, result = outcome(policy.apply, "training", body)
        if verdict != "ok":
            continue
        for path, rule in rules.items():
            got = get_path(result, path)
            if rule.kind == "fixed":
                assert got is not MISSING and canonical(got) == canonical(rule.arg), (path, got, result)
            if got is not MISSING:
                assert rule.admits(got), f"{path} = {got!r} escapes {rule.describe()} in {result!r}"


# -- 2. allowed values ---------------------------------------------------------------------


@TARGETED
@given(
    path=field_paths(),
    allowed=st.lists(st.one_of(json_scalars(), json_values(max_leaves=4)), min_size=1, max_size=4),
    drawn=st.lists(any_values(), max_size=3),
    extras=extras_lists(),
)
def test_allowed_values_cannot_be_escaped_by_type_tricks(path, allowed, drawn, extras):
    """Only values canonically in the list pass; "16", 16.0, true, [16], {"value": 16} do not pass for 16.

    Every type-trick variant of every allowed value is offered; a variant passes only if it is
    itself canonically in the list.
    """
    rule = FieldRule.model_validate({"allowed": allowed})
    policy = single_rule_policy(path, rule)
    texts = {canonical(v) for v in allowed}
    for value in candidates(rule, drawn):
        body = add_extras({}, [path], extras)
        set_path(body, path, value)

        verdict, result = outcome(policy.apply, "training", body)

        if canonical(value) is not None and canonical(value) in texts:
            assert verdict == "ok", f"allowed value {value!r} refused"
            assert canonical(get_path(result, path)) in texts
        else:
            assert verdict == "refused", f"{value!r} escaped allowed {allowed!r}"
            assert result == path


# -- 3. ranges -----------------------------------------------------------------------------


def near_bounds(lo: Any, hi: Any) -> list[Any]:
    """Numbers on and just around the bounds of a range (the off-by-one zone)."""
    out: list[Any] = []
    for b in (lo, hi):
        if b is not None:
            out += [b, b - 1, b + 1, b - 0.5, b + 0.5, math.nextafter(b, -math.inf), math.nextafter(b, math.inf)]
            out += [float(b), -b, str(b), [b], {"value": b}]
    return out


@TARGETED
@given(path=field_paths(), rule=range_rules(), data=st.data())
def test_range_admits_only_finite_non_bool_numbers_within_bounds(path, rule, data):
    """Accepted values are finite ints/floats within bounds; NaN, inf, strings, bools, lists are refused."""
    lo, hi = rule.arg
    value = data.draw(
        st.one_of(
            st.sampled_from(near_bounds(lo, hi) or [0]),
            range_bounds(),
            json_ints(),
            finite_floats(),
            hostile_values(),
            st.booleans(),
            st.sampled_from(["0", "1", "0.5", "nan", "inf"]),
            json_values(max_leaves=3),
        ),
        label="value",
    )
    policy = single_rule_policy(path, rule)
    body: dict[str, Any] = {}
    set_path(body, path, value)

    verdict, result = outcome(policy.apply, "training", body)

    if verdict == "ok":
        got = get_path(result, path)
        assert type(got) in (int, float) and type(got) is not bool
        assert type(got) is int or math.isfinite(got)
        assert (lo is None or got >= lo) and (hi is None or got <= hi)
    else:
        assert result == path
    assert (verdict == "ok") == is_admissible_number(value, lo, hi), (value, rule.arg, verdict)


# -- 4. extra fields and dotted aliases ----------------------------------------------------


@WHOLE_POLICY
@given(case=policy_service_body(), extras=extras_lists())
def test_extra_fields_never_change_the_verdict(case, extras):
    """Extra keys outside every constrained value leave the verdict and constrained values alone."""
    policy, service, body = case
    paths = list(policy.services[service].fields)
    placements = place_extras(body, paths, extras)
    padded = put_extras(body, placements)

    plain_verdict, plain = outcome(policy.apply, service, body)
    padded_verdict, padded_result = outcome(policy.apply, service, padded)

    assert padded_verdict == plain_verdict
    if plain_verdict == "refused":
        assert padded_result == plain, "a different rule refused once extras were added"
    else:
        # The padded result is exactly the plain result plus the same extras.
        assert same_json(padded_result, put_extras(plain, placements))
        for path in paths:
            assert same_json(get_path(padded_result, path), get_path(plain, path))


@TARGETED
@given(path=field_paths(min_segments=2), rule=field_rules(), data=st.data())
def test_dotted_alias_keys_are_refused(path, rule, data):
    """{"lora.rank": v} at the top, or {"lora": {"rank.alpha": v}} part way, is refused for any v."""
    parts = path.split(".")
    cut = data.draw(st.integers(min_value=0, max_value=len(parts) - 2), label="cut")
    value = data.draw(values_for([rule]), label="value")
    body = add_extras({}, [path], data.draw(extras_lists(), label="extras"))
    alias = ".".join(parts[cut:])
    if cut:
        set_path(body, ".".join(parts[:cut]), {alias: value})
    else:
        body[alias] = value
    if data.draw(st.booleans(), label="also nested"):
        # Even with a compliant nested value alongside, the alias is refused.
        nested = rule_values(rule)[:1] if rule.kind != "open" else [1]
        container = body
        for part in parts[:-1]:
            container = container.setdefault(part, {})
        if nested and isinstance(container, dict):
            container.setdefault(parts[-1], nested[0])

    verdict, result = outcome(single_rule_policy(path, rule).apply, "training", body)

    assert verdict == "refused", f"alias {alias!r} slipped past {path}: {result!r}"
    assert result == path


# -- 5. non-objects on a constrained path ------------------------------------------------


@TARGETED
@given(path=field_paths(min_segments=2), rule=field_rules(), blocker=non_objects(), data=st.data())
def test_non_object_on_a_constrained_path_is_refused(path, rule, blocker, data):
    """{"lora": 5} or {"lora": [..]} under a rule on lora.rank is refused, never silently ignored."""
    parts = path.split(".")
    cut = data.draw(st.integers(min_value=1, max_value=len(parts) - 1), label="cut")
    body = add_extras({}, [path], data.draw(extras_lists(), label="extras"))
    set_path(body, ".".join(parts[:cut]), blocker)

    verdict, result = outcome(single_rule_policy(path, rule).apply, "training", body)

    assert verdict == "refused", f"{body!r} passed a rule on {path}"
    assert result == path


# -- 6. no mutation ------------------------------------------------------------------------


@WHOLE_POLICY
@given(case=policy_service_body())
def test_apply_never_mutates_its_input(case):
    """apply works on a copy: the body is unchanged and shares no container with the result."""
    policy, service, body = case
    before = copy.deepcopy(body)
    verdict, result = outcome(policy.apply, service, body)
    assert same_json(body, before)
    if verdict == "ok":
        assert not set(containers(result)) & set(containers(body))


# -- 7. key chains -------------------------------------------------------------------------


@st.composite
def chain_cases(draw: st.DrawFn) -> tuple[Policy, Policy, str, dict[str, Any]]:
    """Two unrelated policies granting a common service, and a body aimed at both rule sets."""
    parent, child = draw(policies()), draw(policies())
    service = draw(st.sampled_from(sorted(set(parent.services) | set(child.services))))
    rules: dict[str, FieldRule] = {}
    for p in (parent, child):
        if service in p.services:
            rules.update(p.services[service].fields)
    return parent, child, service, draw(bodies_for(rules))


@WHOLE_POLICY
@given(case=chain_cases())
def test_chain_accepts_only_what_each_policy_accepts_in_sequence(case):
    """apply_chain([parent, child]) == parent.apply then child.apply on the parent's output."""
    parent, child, service, body = case
    chain_verdict, chain_result = outcome(apply_chain, [parent, child], service, body)

    first_verdict, first = outcome(parent.apply, service, body)
    if first_verdict == "refused":
        assert (chain_verdict, chain_result) == ("refused", first)
        return
    second_verdict, second = outcome(child.apply, service, first)
    assert chain_verdict == second_verdict
    if second_verdict == "refused":
        assert chain_result == second
    else:
        assert same_json(chain_result, second)


@st.composite
def narrowed_policies(draw: st.DrawFn, parent: Policy) -> Policy:
    """A child policy built to pass ``assert_within(parent)``: narrowed rules plus rules of its own."""
    services: dict[str, Any] = {}
    names = draw(st.lists(st.sampled_from(sorted(parent.services)), min_size=1, unique=True))
    for name in names:
        granted = parent.services[name]
        if granted.models == "*":
            models = draw(model_lists())
        else:
            models = draw(st.lists(st.sampled_from(granted.models), unique=True)) if granted.models else []
        fields: dict[str, Any] = {}
        for path, rule in granted.fields.items():
            if draw(st.booleans()):
                fields[path] = draw(narrowed_rules(rule)).root
        # Rules of the child's own, often fixed, often on paths nesting with the parent's.
        own = draw(field_maps(st.one_of(fixed_rules(), field_rules()), max_size=3, near=tuple(granted.fields)))
        for path, rule in own.items():
            if path not in granted.fields:
                fields[path] = rule
        services[name] = {"models": models, "fields": fields}
    return Policy.model_validate({"services": services})


@st.composite
def within_cases(draw: st.DrawFn) -> tuple[Policy, Policy, str, dict[str, Any]]:
    """A parent, a child that passes assert_within, one of the child's services and a body."""
    parent = draw(policies())
    child = draw(narrowed_policies(parent))
    try:
        child.assert_within(parent)
    except PermissionDenied:
        assume(False)
    service = draw(st.sampled_from(sorted(child.services)))
    rules = {**parent.services[service].fields, **child.services[service].fields}
    return parent, child, service, draw(bodies_for(rules))


@WHOLE_POLICY
@given(case=within_cases())
def test_child_within_parent_never_accepts_what_the_parent_refuses(case):
    """If child.assert_within(parent), whatever the child accepts after the parent's fills, the parent accepts."""
    parent, child, service, body = case
    verdict, after_parent = outcome(parent.apply, service, body)
    if verdict != "ok":
        return
    verdict, after_child = outcome(child.apply, service, after_parent)
    if verdict != "ok":
        return

    recheck_verdict, recheck = outcome(parent.apply, service, after_child)

    assert recheck_verdict == "ok", f"child made {after_child!r}, which the parent refuses at {recheck!r}"
    assert same_json(recheck, after_child)
    chain_verdict, chained = outcome(apply_chain, [parent, child], service, body)
    assert chain_verdict == "ok" and same_json(chained, after_child)


@st.composite
def overlapping_parent_child(draw: st.DrawFn) -> tuple[Policy, Policy]:
    """A parent with one rule and a child with a fixed rule on a nesting path (above or below it)."""
    outer = draw(field_paths().filter(lambda p: p.count(".") < 2))
    inner = outer + "." + draw(st.sampled_from(SEGMENTS))
    parent_path, child_path = draw(st.sampled_from([(outer, inner), (inner, outer)]))
    parent_rule = draw(field_rules())
    child_fixed: Any = draw(st.one_of(json_values(max_leaves=3), segment_objects()))
    if child_path == outer and draw(st.booleans()):
        child_fixed = {inner.rsplit(".", 1)[1]: child_fixed}
    parent = Policy.model_validate({"services": {"training": {"fields": {parent_path: parent_rule.root}}}})
    child = Policy.model_validate({"services": {"training": {"fields": {child_path: {"fixed": child_fixed}}}}})
    return parent, child


@TARGETED
@given(pair=overlapping_parent_child(), data=st.data())
def test_child_fixed_fill_cannot_reshape_a_parent_rule(pair, data):
    """A child fixed on lora = {"rank": 64} (or on lora.rank) must not get past a parent rule on lora.rank (or lora)."""
    parent, child = pair
    try:
        child.assert_within(parent)
    except PermissionDenied:
        return
    rules = {**parent.services["training"].fields, **child.services["training"].fields}
    for body in ({}, data.draw(bodies_for(rules), label="body")):
        verdict, after_parent = outcome(parent.apply, "training", body)
        if verdict != "ok":
            continue
        verdict, after_child = outcome(child.apply, "training", after_parent)
        if verdict != "ok":
            continue
        recheck_verdict, recheck = outcome(parent.apply, "training", after_child)
        assert recheck_verdict == "ok", f"child made {after_child!r}, which the parent refuses at {recheck!r}"


# -- 8. model allowlist --------------------------------------------------------------------


@TARGETED
@given(
    models=st.lists(st.sampled_from(MODELS), unique=True, max_size=3),
    model=st.one_of(st.sampled_from(MODELS), json_values(max_leaves=3), st.lists(st.sampled_from(MODELS), max_size=2)),
    extras=extras_lists(),
)
def test_model_allowlist_refuses_non_string_models(models, model, extras):
    """With a list (not "*"), only a string in the list passes; ["teacher"], {"value": ...}, 1 do not."""
    policy = Policy.model_validate({"services": {"rollout": {"models": models}}})
    body = add_extras({"model": model}, [], extras)

    verdict, result = outcome(policy.apply, "rollout", body)

    if isinstance(model, str) and model in models:
        assert verdict == "ok" and result["model"] == model
    else:
        assert verdict == "refused", f"model {model!r} passed allowlist {models!r}"
        assert result == "model"
    assert ServicePolicy(models=models).allows_model(model) == (isinstance(model, str) and model in models)


# -- 9. FieldRule.within -------------------------------------------------------------------


@st.composite
def rule_pairs(draw: st.DrawFn) -> tuple[FieldRule, FieldRule]:
    """(a, b) pairs: half independent rules, half a rule narrowed from b (so a.within(b) often holds)."""
    b = draw(field_rules())
    a = draw(narrowed_rules(b)) if draw(st.booleans()) else draw(field_rules())
    return a, b


@TARGETED
@given(pair=rule_pairs(), data=st.data())
def test_within_implies_admits_inclusion(pair, data):
    """a.within(b) implies: for every value v, a.admits(v) implies b.admits(v)."""
    a, b = pair
    assume(a.within(b))
    drawn = data.draw(st.lists(values_for([a, b]), max_size=5), label="values")
    range_edges = [x for r in (a, b) if r.kind == "range" for x in near_bounds(*r.arg)]
    hostile = [math.nan, math.inf, -math.inf, 10**400, -(10**400)]
    for value in candidates(a, []) + candidates(b, drawn) + range_edges + hostile:
        if a.admits(value):
            assert b.admits(value), f"{a.describe()} within {b.describe()} but admits {value!r} and b does not"


def test_type_tricks_examples_are_refused():
    """The examples named in the module docstring, spelled out."""
    policy = single_rule_policy("lora.rank", FieldRule.model_validate({"fixed": 16}))
    for trick in ("16", 16.0, True, [16], {"value": 16}):
        with pytest.raises(PermissionDenied) as err:
            policy.apply("training", {"lora": {"rank": trick}})
        assert err.value.param == "lora.rank"
    for body in ({"lora.rank": 64}, {"lora.rank": 16}, {"lora": 5}, {"lora": [{"rank": 16}]}):
        with pytest.raises(PermissionDenied):
            policy.apply("training", body)
    assert policy.apply("training", {}) == {"lora": {"rank": 16}}


def test_regressions_found_by_this_harness():
    """The three holes these properties found in the matcher, pinned as plain examples."""
    # 1. An int beyond float range raised OverflowError (a 500) instead of being judged.
    ranged = single_rule_policy("lora.rank", FieldRule.model_validate({"range": [0, 64]}))
    with pytest.raises(PermissionDenied):
        ranged.apply("training", {"lora": {"rank": 10**400}})
    assert single_rule_policy("n", FieldRule.model_validate({"range": [0, None]})).apply("training", {"n": 10**400})
    # 2. A fixed fill on lora slipped rank 64 past an earlier rule on lora.rank of the same policy.
    same = Policy.model_validate(
        {"services": {"training": {"fields": {"lora.rank": {"allowed": [8, 16]}, "lora": {"fixed": {"rank": 64}}}}}}
    )
    with pytest.raises(PermissionDenied):
        same.apply("training", {})
    # 3. A child fixed on lora = {"rank": 64} passed assert_within under a parent allowing lora.rank 8 or 16.
    parent = Policy.model_validate({"services": {"training": {"fields": {"lora.rank": {"allowed": [8, 16]}}}}})
    for fields in ({"lora": {"fixed": {"rank": 64}}}, {"lora.rank.x": {"fixed": 1}}):
        child = Policy.model_validate({"services": {"training": {"fields": fields}}})
        with pytest.raises(PermissionDenied):
            child.assert_within(parent)
