"""Declarative per-key policy and its matcher.

A policy grants services and constrains request fields by path (``lora.rank``,
``learning_rate``, ``model``)::

    {"services": {
        "rollout":  {"models": ["teacher"], "max_concurrency": 8,
                     "fields": {"temperature": {"range": [0, 1]}}},
        "training": {"fields": {"lora.rank": {"fixed": 16}, "learning_rate": {"allowed": [1e-4]}}},
        "sandbox":  {"internet": false, "max_concurrency": 5}}}

A field rule is ``"open"``, ``{"fixed": v}``, ``{"allowed": [v, ...]}`` or
``{"range": [lo, hi]}``. Matching is by canonical JSON, so ``"16"`` is not ``16``, ``true``
is not ``1``, ``16.0`` is not ``16`` and ``{"value": 16}`` is not ``16``: nothing escapes a
rule through a type trick. Fixed fields are filled in when absent and refused when different.
A request is checked against every policy of the key's chain, root first, so a child key can
never do more than its parent even if its own policy said otherwise.

A section's knobs are the common ones (:class:`PolicyKnobs`: models, caps, field rules) and the
extras each service declares in its spec (``internet``, ``door``, ``detail``, ``cross_run``,
``owners``); the sections are registered in access/sections.py, and a section or knob it does not
know is refused. A child key's policy is held within its parent's knob by knob, each by the
narrowing rule its owner declares with it (kit/policy_knobs.py).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, model_validator
from pydantic_core import PydanticCustomError

from access.sections import LIMITED_ONLY, SECTIONS, SectionExtras
from kit.errors import PermissionDenied
from kit.policy_knobs import Allowlist, Cap, Narrowing, PolicyExtras, narrowing_of
from kit.spec import NO_DEFAULT

_MISSING = object()


def canonical(value: Any) -> str | None:
    """Canonical JSON text of a value; None for values JSON cannot hold exactly (NaN, inf)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None


def _is_number(value: Any) -> bool:
    # Ints are always finite; math.isfinite would raise OverflowError on ints beyond float range.
    return type(value) is int or (type(value) is float and math.isfinite(value))


class FieldRule(RootModel[Any]):
    """One of: "open" | {"fixed": v} | {"allowed": [...]} | {"range": [lo, hi]}."""

    @model_validator(mode="after")
    def _check_form(self) -> FieldRule:
        rule = self.root
        if rule == "open":
            return self
        if not isinstance(rule, dict) or len(rule) != 1:
            raise ValueError('a field rule is "open", {"fixed": v}, {"allowed": [...]} or {"range": [lo, hi]}')
        (kind, arg), = rule.items()
        if kind == "fixed":
            if canonical(arg) is None:
                raise ValueError("a fixed value must be plain JSON")
        elif kind == "allowed":
            if not isinstance(arg, list) or not arg or any(canonical(v) is None for v in arg):
                raise ValueError("allowed needs a non-empty list of plain JSON values")
        elif kind == "range":
            if (
                not isinstance(arg, list)
                or len(arg) != 2
                or not all(v is None or _is_number(v) for v in arg)
                or (arg[0] is not None and arg[1] is not None and arg[0] > arg[1])
            ):
                raise ValueError("range needs [lo, hi] numbers (either may be null), lo <= hi")
        else:
            raise ValueError(f"unknown field rule {kind!r}")
        return self

    @property
    def kind(self) -> str:
        return "open" if self.root == "open" else next(iter(self.root))

    @property
    def arg(self) -> Any:
        return None if self.root == "open" else next(iter(self.root.values()))

    def admits(self, value: Any) -> bool:
        kind, arg = self.kind, self.arg
        if kind == "open":
            return True
        if kind == "fixed":
            return canonical(value) is not None and canonical(value) == canonical(arg)
        if kind == "allowed":
            text = canonical(value)
            return text is not None and text in {canonical(v) for v in arg}
        lo, hi = arg
        return _is_number(value) and (lo is None or value >= lo) and (hi is None or value <= hi)

    def within(self, parent: FieldRule) -> bool:
        """Is every value this rule admits also admitted by ``parent``?"""
        if parent.kind == "open":
            return True
        if self.kind == "open":
            return False
        if self.kind == "fixed":
            return parent.admits(self.arg)
        if self.kind == "allowed":
            return all(parent.admits(v) for v in self.arg)
        # self is a range
        if parent.kind != "range":
            return False
        (lo, hi), (plo, phi) = self.arg, parent.arg
        return (plo is None or (lo is not None and lo >= plo)) and (phi is None or (hi is not None and hi <= phi))

    def bound(self, value: Any) -> Any:
        """``value`` if this rule admits it, else the nearest value it does (see fill_left_out)."""
        if self.admits(value):
            return value
        if self.kind == "range":
            lo, hi = self.arg
            if _is_number(value) and lo is not None and value < lo:
                return lo
            if _is_number(value) and hi is not None and value > hi:
                return hi
            return lo if lo is not None else hi
        if self.kind == "allowed" and self.arg:
            numbers = [v for v in self.arg if _is_number(v)]
            if _is_number(value) and numbers:
                return min(numbers, key=lambda v: (abs(v - value), v))
            return copy.deepcopy(self.arg[0])
        return value  # fixed fills itself; open admits everything

    def describe(self) -> str:
        return "open" if self.kind == "open" else f"{self.kind} {json.dumps(self.arg)}"


class FieldRulesWithin(Narrowing):
    """The ``fields`` knob: a child's rule on a path its parent constrains is within the parent's,
    and a child's fixed fill never lands above or below a parent's rule path."""

    def check(self, child: Any, parent: Any, *, where: str, platform: bool) -> None:
        for path, rule in parent.items():
            mine = child.get(path)
            if mine is not None and not mine.within(rule):
                raise PermissionDenied(f"child rule for {path} is wider than the parent's ({rule.describe()})",
                                       param=path)
        # A child's fixed fill above or below a parent's rule path would change what that rule
        # sees after the parent has checked it ({"lora": {"fixed": {"rank": 64}}} vs lora.rank).
        for path, rule in child.items():
            if rule.kind != "fixed":
                continue
            for theirs in parent:
                a, b = path.split("."), theirs.split(".")
                if a != b and (a[: len(b)] == b or b[: len(a)] == a):
                    raise PermissionDenied(
                        f"child fixed rule on {path} overlaps the parent's rule on {theirs}; constrain {theirs} itself",
                        param=path,
                    )


class PolicyKnobs(PolicyExtras):
    """The knobs every section has: the gateway applies them itself, whatever the service."""

    models: Annotated[list[str] | Literal["*"],
                      Allowlist("child models must be a subset of the parent's", platform_may_widen=True)] = "*"
    """Model allowlist (inference, rollout, evaluation). A platform mint (an evaluation job's model
    door) may name one of the run's checkpoints where the parent lists base models: the service
    checked it against the parent's allowlist (on its base) before minting, and inference checks
    every key of the chain."""
    max_concurrency: Annotated[int | None, Field(ge=0),
                               Cap("child concurrency must not exceed the parent's")] = None
    tokens_per_minute: Annotated[int | None, Field(ge=0),
                                 Cap("child tokens_per_minute must not exceed the parent's")] = None
    """Rollout and the agent route: worst-case tokens (prompt bound + max_tokens) this key may
    reserve per clock minute; every ancestor's limit applies too (billing/rate_limits.py).
    None: no limit of its own."""
    fields: Annotated[dict[str, FieldRule], FieldRulesWithin()] = Field(default_factory=dict)
    """Request field rules by dotted path (see the module's docstring)."""

    def allows_model(self, model: Any) -> bool:
        return self.models == "*" or (isinstance(model, str) and model in self.models)


class ServicePolicy(SectionExtras, PolicyKnobs):
    """One section of a policy: the common knobs and every section's declared extras
    (access/sections.py), so a policy keeps one JSON shape."""


NARROWING: dict[str, Narrowing] = {name: narrowing_of(name, field) for name, field in ServicePolicy.model_fields.items()}
"""Each knob's narrowing rule, as its owner declared it."""


def _known_section(name: str) -> str:
    """A section name the registry knows (access/sections.py). Checked on the key, so the error's
    location is ``services.<the name>`` and every path a policy enters (the admin API, a key's own
    child keys, ``--policy-file``, a task's overrides, a preset) names the misspelt section itself."""
    if name not in SECTIONS:
        raise PydanticCustomError("unknown_policy_section", "unknown policy section '{name}'; the sections are "
                                  "{allowed}", {"name": name, "allowed": ", ".join(sorted(SECTIONS))})
    return name


SectionName = Annotated[str, AfterValidator(_known_section)]


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    services: dict[SectionName, ServicePolicy] = Field(default_factory=dict)

    def service(self, name: str) -> ServicePolicy | None:
        return self.services.get(name)

    # -- request matching ------------------------------------------------------------------

    def apply(self, service: str, body: dict[str, Any], *, model_field: str | None = "model") -> dict[str, Any]:
        """Check ``body`` against this policy; return it with fixed fields filled in.

        Raises :class:`PermissionDenied` naming the rule and the field.
        """
        rules = self.services.get(service)
        if rules is None:
            raise PermissionDenied(f"this key is not granted the {service} service", param=service)
        out = copy.deepcopy(body)
        for path, rule in rules.fields.items():
            _apply_rule(out, path, rule, service)
        # A later fill can land inside a field an earlier rule already passed ({"lora": ...} and
        # lora.rank): check every rule again on the filled body (this pass fills nothing new).
        for path, rule in rules.fields.items():
            _apply_rule(out, path, rule, service)
        if model_field is not None and model_field in out and not rules.allows_model(out[model_field]):
            raise PermissionDenied(
                f"model {out[model_field]!r} is not in this key's {service} model allowlist", param=model_field
            )
        return out

    # -- narrowing (child keys) -------------------------------------------------------------

    def inheriting_limits(self, parent: Policy) -> Policy:
        """This policy with each knob it leaves out in a section it names taken from ``parent``
        where the knob's rule says so (a cap: a child that says nothing about it gets its
        parent's, rather than being refused for not stating one)."""
        services: dict[str, ServicePolicy] = {}
        for name, mine in self.services.items():
            theirs = parent.services.get(name)
            inherited: dict[str, Any] = {}
            for knob, rule in NARROWING.items() if theirs is not None else ():
                own = getattr(mine, knob)
                if (value := rule.inherited(own, getattr(theirs, knob))) is not own:
                    inherited[knob] = value
            services[name] = mine.model_copy(update=inherited) if inherited else mine
        return Policy(services=services)

    def assert_within(self, parent: Policy, *, platform: bool = False) -> None:
        """Refuse a child policy that grants anything its parent does not, knob by knob by each
        knob's narrowing rule (``platform``: the gym itself mints the key and may add a model door)."""
        for name, child in self.services.items():
            granted = parent.services.get(name)
            if granted is None and name in LIMITED_ONLY:
                granted = ServicePolicy()  # no entry: not limited there (the meter grants the route)
            if granted is None:
                raise PermissionDenied(f"the parent key is not granted the {name} service", param=f"services.{name}")
            for knob, rule in NARROWING.items():
                rule.check(getattr(child, knob), getattr(granted, knob), where=f"services.{name}.{knob}",
                           platform=platform)


def narrowed(policy: Policy, ancestors: Sequence[Policy], *, platform: bool = False) -> Policy:
    """``policy`` for a key minted below ``ancestors`` (root first, the parent last): what it leaves
    out inherited from its parent, refused if it grants anything any ancestor does not."""
    policy = policy.inheriting_limits(ancestors[-1])
    for ancestor in ancestors:
        policy.assert_within(ancestor, platform=platform)
    return policy


def fill_left_out(policies: list[Policy], service: str, body: dict[str, Any],
                  default_of: Callable[[str], Any]) -> dict[str, Any]:
    """Give every field a ``range`` or ``allowed`` rule of the chain constrains, and the body
    leaves out, its *effective* value — the service's default (``default_of(path)``), bounded by
    the rules — explicitly, so the rule judges what would run, not the absence of a field.

    Bounded: a default a rule refuses becomes the nearest value it admits (a range's end; the
    allowed number nearest to it, else the first allowed value), so ``max_tokens`` left out under
    ``allowed = [256, 512]`` runs with 512, not the service's 1024. A field whose default cannot be
    told is refused: the agent must give it. (``fixed`` rules fill their own value.)"""
    rules_by_path: dict[str, list[FieldRule]] = {}
    for policy in policies:
        granted = policy.services.get(service)
        for path, rule in (granted.fields.items() if granted else ()):
            if rule.kind in ("range", "allowed"):
                rules_by_path.setdefault(path, []).append(rule)
    if not rules_by_path:
        return body  # the hot path: no rule to judge a left-out field by, nothing to copy
    out = copy.deepcopy(body)
    for path, rules in rules_by_path.items():
        *parents, leaf = path.split(".")
        container: Any = out
        for part in parents:
            if not isinstance(container, dict):
                break  # not an object: apply_chain refuses it with the rule's own message
            container = container.setdefault(part, {}) if part not in container else container[part]
        if not isinstance(container, dict) or leaf in container:
            continue
        value = default_of(path)
        if value is NO_DEFAULT:
            raise PermissionDenied(
                f"{service} field {path} is required by this key's policy ({rules[-1].describe()}): left out, "
                "the service's default for it is not one the policy can check; give a value", param=path)
        for rule in rules:  # root first; a child's rule is within its parent's
            value = rule.bound(value)
        container[leaf] = value
    return out


def apply_chain(policies: list[Policy], service: str, body: dict[str, Any], *, model_field: str | None = "model") -> dict[str, Any]:
    """Apply every policy of a key chain, root first."""
    for policy in policies:
        body = policy.apply(service, body, model_field=model_field)
    return body


def _apply_rule(body: dict[str, Any], path: str, rule: FieldRule, service: str) -> None:
    parts = path.split(".")
    container: Any = body
    for i, part in enumerate(parts):
        if not isinstance(container, dict):
            raise PermissionDenied(f"{'.'.join(parts[:i])} must be an object (policy rule on {path})", param=path)
        rest = ".".join(parts[i:])
        if i < len(parts) - 1 and rest in container:
            # {"lora.rank": 64} must not slip past a rule on lora.rank.
            raise PermissionDenied(f"field name {rest!r} is not accepted; use nested objects", param=path)
        if i == len(parts) - 1:
            break
        nxt = container.get(part, _MISSING)
        if nxt is _MISSING:
            if rule.kind != "fixed":
                return
            nxt = container[part] = {}
        container = nxt
    leaf = parts[-1]
    value = container.get(leaf, _MISSING)
    if value is _MISSING:
        if rule.kind == "fixed":
            container[leaf] = copy.deepcopy(rule.arg)
        return
    if not rule.admits(value):
        raise PermissionDenied(
            f"{service} field {path} = {json.dumps(value, default=str)} is refused by this key's policy "
            f"({rule.describe()})",
            param=path,
        )
