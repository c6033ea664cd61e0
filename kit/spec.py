"""What the gateway knows about each service: its operations and how to price them.

A service declares its routes here once; the gateway refuses anything not declared
(fail closed), applies policy to the declared bodies and reserves each metered
operation's worst case with the service's own estimator before forwarding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from kit.canonical import Spellings, spellings_of
from kit.config import GymConfig
from kit.policy_knobs import PolicyExtras
from kit.settings import GymSettings, ProviderSecrets
from services.records.record_anchor import anchor_for
from storage.store import Store

NO_DEFAULT = object()
"""What :meth:`Operation.default_of` answers for a field whose effective default it cannot tell."""

Estimator = Callable[[dict[str, Any], "ServiceContext", Any], int]
"""(validated body, service context, principal) → worst-case cost in nano-USD."""


@dataclass
class ServiceContext:
    """What every service (and the gateway's estimators) may use."""

    config: GymConfig
    store: Store
    settings: GymSettings
    internal_secret: str
    secrets: ProviderSecrets

    def __post_init__(self) -> None:
        # Every process of the gym checks and extends its record chains against the same anchor
        # outside the store; a store shared by several contexts keeps the first one's.
        if self.store is not None and self.store.record_anchor is None:
            self.store.record_anchor = anchor_for(self.settings, self.internal_secret)

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    """Service-relative path; ``{name}`` segments match one path segment."""
    name: str
    estimate: Estimator | None = None
    """Worst-case cost in nano-USD of one call; None = not metered."""
    tokens: Estimator | None = None
    """Worst-case tokens of one call (prompt bound + max_tokens, per choice), counted against
    the key's ``tokens_per_minute`` (billing/rate_limits.py); None = not token-limited."""
    pure_estimates: bool = False
    """``estimate`` and ``tokens`` only compute on the body and the config (no store, no I/O): the
    gateway runs them on the event loop for a small body instead of sending them to a thread."""
    json_body: bool = False
    """The body is a JSON object checked against the key's policy fields."""
    allows_nul: bool = False
    """The body's strings may hold NUL (U+0000): a model's prompt, relayed to its provider and kept
    only as escaped JSON. Every other route refuses it when the body is parsed (PostgreSQL's text
    cannot hold it; kit/request_json.py)."""
    model_field: str | None = None
    """Body field holding a model name to check against the key's allowlist."""
    concurrency: bool = True
    """Count the call against the key's per-call concurrency cap. Off for services whose cap
    means something that outlives a call (live sandboxes, held by the service itself)."""
    auth: str = "key"
    """``key``: the run key. ``sandbox_token``: the run key, or a sandbox access token (what
    E2B's SDK sends its sandbox daemon) — see services/sandbox/tokens.py. ``tinker_key``: the run
    key, bare or written ``tml-<run key>`` (the Tinker SDK refuses keys without that prefix)."""
    schema: type[BaseModel] | None = None
    """The request body's schema (``json_body`` operations): every spelling it accepts for a
    field is rewritten to one before policies match (kit/canonical.py)."""
    synonyms: Mapping[str, str] = field(default_factory=dict, compare=False)
    body_limit: Literal["json", "upload", "files"] = "json"
    """Which size limit the gateway holds the request body to while it streams in
    (kit/body_limits.py): ``json`` every call that is not an upload
    (``http.max_json_body_bytes``), ``upload`` datasets and harness archives
    (``http.max_upload_body_bytes``), ``files`` sandbox file writes (``sandbox.max_file_transfer_mb``)."""
    """Other names the API gives a schema field (``max_completion_tokens`` → ``max_tokens``)."""
    defaults: Callable[[dict[str, Any], GymConfig], Mapping[str, Any]] | None = field(default=None, compare=False)
    """(body, config) → what the service gives fields left out whose schema default does not say
    (a ``None`` default the service resolves from its config, e.g. ``max_tokens``), by canonical
    dotted path. Policies judge a left-out field by this effective value (:meth:`default_of`)."""
    spellings: Spellings | None = field(init=False, repr=False, compare=False, default=None)
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\\\{[a-z_]+\\\}", r"[^/]+", re.escape(self.path))
        object.__setattr__(self, "_pattern", re.compile(f"^{regex}$"))
        if self.json_body and self.schema is None:
            raise ValueError(f"{self.method} {self.path}: a JSON-body operation declares its schema")
        if self.schema is not None:
            object.__setattr__(self, "spellings", spellings_of(self.schema, self.synonyms))

    def default_of(self, path: str, body: dict[str, Any], config: GymConfig) -> Any:
        """The value the service uses for ``path`` (canonical, dotted) when the body leaves it
        out: the declared :attr:`defaults`, else the schema's own non-``None`` default (through
        nested models); :data:`NO_DEFAULT` when neither tells."""
        if self.defaults is not None:
            declared = self.defaults(body, config)
            if path in declared:
                return declared[path]
        model: type[BaseModel] | None = self.schema
        value: Any = NO_DEFAULT
        for part in path.split("."):
            found = next(((n, f) for n, f in model.model_fields.items() if (f.alias or n) == part), None) if model else None
            if found is None:
                return NO_DEFAULT
            name, info = found
            value = getattr(value, name) if isinstance(value, BaseModel) else info.get_default(call_default_factory=True)
            model = type(value) if isinstance(value, BaseModel) else None
        if value is None or value is NO_DEFAULT:
            return NO_DEFAULT
        return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value

    @property
    def metered(self) -> bool:
        return self.estimate is not None

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and bool(self._pattern.match(path))


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    operations: tuple[Operation, ...]
    """What a run key may call (through the gateway's proxy)."""
    operator_operations: tuple[Operation, ...] = ()
    """What only the operator reaches, through the gateway's admin API (gateway/admin.py);
    never matched for a run key. Declared so that spec and router list the same routes."""
    policy: type[PolicyExtras] = PolicyExtras
    """The knobs this service adds to its section of a key's policy, each with its narrowing rule
    (kit/policy_knobs.py); the section's common knobs are access/policy.py's."""

    def match(self, method: str, path: str) -> Operation | None:
        return next((op for op in self.operations if op.matches(method, path)), None)

    def canonical_rule_path(self, path: str) -> str:
        """A policy rule's path as the bodies of this service's operations spell it; a rule
        written under another spelling would never match a canonicalised body."""
        for op in self.operations:
            if op.spellings is not None and (canonical := op.spellings.canonical_path(path)) != path:
                return canonical
        return path
