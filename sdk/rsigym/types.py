"""Pydantic models of what the gateway answers.

Models accept unknown fields (``extra="allow"``) so a newer server never breaks an
older SDK; extra fields are reachable as attributes and appear in ``model_dump()``.

Top-level answers (:class:`ChatCompletion`, :class:`Model`) also expose the HTTP
response's ``request_id``, ``cost_usd`` and ``remaining_usd`` as read-only properties.
They are stored in a pydantic ``PrivateAttr``, so they are not fields: ``model_dump()``
and ``model_dump_json()`` give exactly the server's data. Objects you build yourself
have them as ``None``. :class:`Balance` and :class:`ChildKey` have a ``remaining_usd``
*field* of their own (from the body), so only ``request_id`` and ``cost_usd`` come from
the headers there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ._response import HasMeta, HasRequestMeta, ObjectList, ResponseMeta

__all__ = [
    "ResponseMeta",
    "ObjectList",
    "Balance",
    "ChatMessage",
    "Choice",
    "Usage",
    "ChatCompletion",
    "ChoiceDelta",
    "ChunkChoice",
    "ChatCompletionChunk",
    "Model",
    "ChildKey",
    "SandboxRecord",
    "SandboxEntry",
    "CommandResult",
    "BenchmarkSplit",
    "Benchmark",
    "Harness",
    "EvaluationProgress",
    "EvaluationJob",
    "TrialResult",
    "Submission",
    "RecordEvent",
    "ExperimentAction",
    "ExperimentEvaluation",
    "Experiment",
    "ExperimentDiff",
    "Lineage",
    "BestCheckpoint",
    "Annotation",
    "ChainReport",
]


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")


class _WithMeta(_Base):
    _meta: ResponseMeta = PrivateAttr(default_factory=ResponseMeta)


class GymObject(HasMeta, _WithMeta):
    """A top-level answer: data fields plus response metadata (see module doc)."""


class Balance(HasRequestMeta, _WithMeta):
    """The run's money. ``remaining_usd`` is the body's field (the header says the same)."""

    budget_usd: float
    spent_usd: float
    reserved_usd: float
    remaining_usd: float


# ---- OpenAI-compatible chat completions -------------------------------------------


class ChatMessage(_Base):
    role: str
    content: str | None = None


class Choice(_Base):
    index: int = 0
    message: ChatMessage = Field(default_factory=lambda: ChatMessage(role="assistant"))
    finish_reason: str | None = None


class Usage(_Base):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None  # RSIGym extension: what the call was charged


class ChatCompletion(GymObject):
    id: str | None = None  # providers behind the gateway may omit id / created
    object: str = "chat.completion"
    created: int | None = None
    model: str
    choices: list[Choice]
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """Content of the first choice ('' when there is none)."""
        return (self.choices[0].message.content or "") if self.choices else ""


class ChoiceDelta(_Base):
    role: str | None = None
    content: str | None = None


class ChunkChoice(_Base):
    index: int = 0
    delta: ChoiceDelta = Field(default_factory=ChoiceDelta)
    finish_reason: str | None = None


class ChatCompletionChunk(_Base):
    """One ``data:`` event of a streamed chat completion (metadata lives on the stream).

    With ``stream_options={"include_usage": True}`` the last chunk has no choices and
    carries ``usage`` (with ``cost_usd``) instead.
    """

    id: str | None = None
    object: str = "chat.completion.chunk"
    created: int | None = None
    model: str
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """Content delta of the first choice ('' when there is none)."""
        return (self.choices[0].delta.content or "") if self.choices else ""


class Model(GymObject):
    id: str
    object: str = "model"
    created: int | None = None
    owned_by: str | None = None
    pricing: dict[str, Any] | None = None


# ---- keys ------------------------------------------------------------------------


class ChildKey(HasRequestMeta, _WithMeta):
    """A key minted from the run's key, with its own (sub-)budget and policy.

    ``key`` holds the plaintext secret only in the answer to ``keys.mint()``; the
    gateway stores it hashed and never shows it again. It is kept out of ``repr()``.
    ``remaining_usd`` is the key's own remaining budget when the gateway reports it
    (a field, like :class:`Balance`'s, not the response header).
    """

    id: str
    key: str | None = Field(default=None, repr=False)
    name: str | None = None
    prefix: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    track: str | None = None
    status: str | None = None
    budget_usd: float | None = None
    policy: dict[str, Any] | None = None
    spent_usd: float | None = None
    reserved_usd: float | None = None
    remaining_usd: float | None = None
    created_at: datetime | None = None


class Dataset(HasRequestMeta, _WithMeta):
    """An uploaded dataset (content-addressed; identical content is stored once)."""

    id: str
    object: str = "dataset"
    name: str | None = None
    sha256: str
    format: str
    rows: int
    bytes: int
    created_at: str | None = None


class TrainingStepMetrics(_Base):
    step: int
    loss: float
    lr: float
    tokens: int
    grad_norm: float
    cost_usd: float
    cumulative_cost_usd: float
    loss_s: float | None = None
    """Wall seconds of the custom loss this step (billed per second in ``cost_usd``)."""


class TrainingJob(_WithMeta):
    """A training job; ``cost_usd`` is what its steps have cost so far."""

    id: str
    object: str = "training.job"
    status: str
    base_model: str
    parent_checkpoint: str | None = None
    datasets: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    step: int = 0
    total_steps: int = 0
    cost_usd: float = 0.0
    error: str | None = None
    metrics: list[TrainingStepMetrics] | None = None
    checkpoints: list[str] | None = None
    experiment: str | None = None
    """The experiment the job is attached to."""
    queue_position: int | None = None
    """While queued: its place in the fair queue (1 = next to start); None once it started."""
    queued_s: float | None = None
    """Seconds waited in the queue: so far while queued, until it started afterwards."""
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled", "budget_exhausted")


class Checkpoint(HasRequestMeta, _WithMeta):
    id: str
    object: str = "checkpoint"
    job_id: str
    base_model: str
    parent_checkpoint: str | None = None
    dataset_hashes: list[str] = Field(default_factory=list)
    config_hash: str
    loss_module_hash: str | None = None
    step: int
    metrics: dict[str, Any] = Field(default_factory=dict)
    weights_hash: str
    experiment: str | None = None
    created_at: str | None = None


# ---- sandboxes -------------------------------------------------------------------


class SandboxRecord(_WithMeta):
    """The gym's record of a sandbox, running or ended.

    ``state`` is ``running``, ``killed``, ``timed_out``, ``budget_exhausted`` or ``failed``;
    ``end_reason`` says why it ended. ``seconds`` and ``cost_usd`` are the time billed and
    what it cost so far (a *field*: the sandbox's total, not this response's header).
    """

    id: str
    object: str = "sandbox"
    template: str
    state: str
    end_reason: str | None = None
    internet: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    started_at: datetime | None = None
    end_at: datetime | None = None
    """When its timeout runs out (while running)."""
    ended_at: datetime | None = None
    seconds: float = 0.0
    cost_usd: float = 0.0
    usd_per_hour: float | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"


class SandboxEntry(_Base):
    """A file or directory in a sandbox. ``type`` is ``"file"`` or ``"dir"``.

    Only ``name``, ``type`` and ``path`` are known for what ``files.write`` returns.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    type: str
    path: str
    size: int = 0
    mode: int = 0
    permissions: str | None = None
    owner: str | None = None
    group: str | None = None
    modified_time: datetime | None = Field(default=None, alias="modifiedTime")
    symlink_target: str | None = Field(default=None, alias="symlinkTarget")


class CommandResult(_Base):
    """What a finished command printed and how it ended (a non-zero ``exit_code`` is not an error)."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int
    status: str | None = None
    """The daemon's wording: ``exit status 3``, ``signal: killed``, …"""
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# ---- evaluation ------------------------------------------------------------------


class BenchmarkSplit(_Base):
    """One split of a benchmark: ``hidden`` splits (e.g. ``official``) are not listed for agents."""

    hidden: bool = False
    tasks: int = 0


class Benchmark(HasRequestMeta, _WithMeta):
    """A registered benchmark. ``status`` is ``validating``, ``ready`` or ``refused``; only a
    ``ready`` one can be evaluated on. ``validation`` (its details) is shown to operators only."""

    name: str
    object: str = "benchmark"
    version: str | None = None
    description: str = ""
    splits: dict[str, BenchmarkSplit] = Field(default_factory=dict)
    status: str | None = None
    validation: dict[str, Any] | None = None
    training_pool: dict[str, Any] | None = None
    """``{"rows", "sha256"}`` of the benchmark's training pool (``evaluation.training_pool(name)``), if it has one."""

    @property
    def ready(self) -> bool:
        return self.status == "ready"


class Harness(HasRequestMeta, _WithMeta):
    """An uploaded harness archive (content-addressed per run: the same bytes give the same harness).

    ``manifest`` is the ``[harness]`` table of its ``harness.toml`` (``name``, ``run``, ``install``)."""

    id: str
    object: str = "harness"
    name: str
    sha256: str
    bytes: int = 0
    files: int = 0
    manifest: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None


class EvaluationProgress(_Base):
    done: int = 0
    total: int = 0

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


class EvaluationJob(HasRequestMeta, _WithMeta):
    """An evaluation job: one benchmark split × model × harness × attempts.

    ``status`` goes ``queued`` → ``running`` → ``succeeded`` | ``failed`` | ``cancelled``.
    ``score`` is avg@k (the mean over tasks of each task's mean reward over its attempts), set
    when the job ends. ``tasks`` is the number of tasks, ``progress`` counts trials (tasks ×
    attempts). ``detail`` (``full`` or ``aggregate``) says whether this key may read per-task
    results; it is present on single-job answers.
    """

    id: str
    object: str = "evaluation.job"
    purpose: str | None = None
    status: str
    benchmark: str
    split: str
    model: str
    harness: str
    attempts: int = 1
    sampling: dict[str, Any] = Field(default_factory=dict)
    tasks: int = 0
    progress: EvaluationProgress = Field(default_factory=EvaluationProgress)
    score: float | None = None
    error: str | None = None
    detail: str | None = None
    experiment: str | None = None
    comparison: dict[str, Any] | None = None
    """A succeeded dev evaluation of a checkpoint against the run's evaluation of its parent (or
    base) on the same tasks: ``diff``, ``ci95`` (paired bootstrap over tasks), ``within_noise``."""
    queue_position: int | None = None
    """While queued: its place in the fair queue (1 = next to start); None once it started."""
    queued_s: float | None = None
    """Seconds waited in the queue: so far while queued, until it started afterwards."""
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


class TrialResult(_Base):
    """One trial (task × attempt) of an evaluation job. ``reward`` is None when the trial failed
    before it was verified (``error`` says why); ``trajectory`` is the harness's ATIF trajectory."""

    task_id: str
    attempt: int = 1
    reward: float | None = None
    error: str | None = None
    trajectory: dict[str, Any] | None = None
    verifier_output: str = ""
    agent_output: str = ""
    sandbox_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class Submission(HasRequestMeta, _WithMeta):
    """What a run hands in for scoring. ``model`` is what is evaluated: the checkpoint id, or the
    base model when the track keeps it; ``harness`` is ``minimal`` or an uploaded harness id."""

    id: str
    object: str = "submission"
    run_id: str | None = None
    track: str | None = None
    checkpoint: str | None = None
    model: str
    harness: str
    created_at: datetime | None = None


# ---- records (the Experiment OS) --------------------------------------------------------


class RecordEvent(_Base):
    """A platform event: written by the gym only, immutable, hash-chained per run (``hash``
    covers every field and the previous event's ``prev_hash``)."""

    object: str = "event"
    run_id: str
    seq: int
    kind: str
    key_id: str | None = None
    experiment_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    prev_hash: str = ""
    hash: str = ""


class ExperimentAction(_Base):
    kind: str
    """``training`` or ``evaluation``."""
    job_id: str
    status: str | None = None
    config_hash: str | None = None
    datasets: list[dict[str, Any]] = Field(default_factory=list)


class ExperimentEvaluation(_Base):
    job_id: str
    status: str | None = None
    benchmark: str | None = None
    split: str | None = None
    attempts: int | None = None
    score: float | None = None
    model: str | None = None
    harness: str | None = None


class Experiment(HasRequestMeta, _WithMeta):
    """A node of the run's research graph: what it started from (``theta_in``), what was done
    (``action``), what came out (``theta_out``) and how it scored (``evaluations``) — all from
    platform events. ``status`` is set by audits: ``pending``, ``accepted`` or ``flagged``
    (``reasons``, each ``"<check>: <category> (<CODE>)"``: the evidence is the operator's).
    Single-experiment answers also carry ``events`` and ``annotations``."""

    id: str
    object: str = "experiment"
    owner_key_id: str
    name: str
    implicit: bool = False
    parents: list[str] = Field(default_factory=list)
    status: str = "pending"
    reasons: list[str] = Field(default_factory=list)
    created_at: datetime | None = None
    theta_in: dict[str, Any] = Field(default_factory=dict)
    action: list[ExperimentAction] = Field(default_factory=list)
    theta_out: dict[str, Any] = Field(default_factory=dict)
    evaluations: list[ExperimentEvaluation] = Field(default_factory=list)
    events: list[RecordEvent] | None = None
    annotations: list[dict[str, Any]] | None = None


class ExperimentDiff(HasRequestMeta, _WithMeta):
    """Two experiments compared: ``config`` (hashes and differing job config ``fields``),
    ``data`` (datasets ``added``/``removed``/``common`` by sha256), ``scores`` (per benchmark and
    split: ``a``, ``b``, ``delta`` = b − a)."""

    object: str = "experiment.diff"
    a: str
    b: str
    config: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    scores: list[dict[str, Any]] = Field(default_factory=list)


class Lineage(HasRequestMeta, _WithMeta):
    """A checkpoint's chain back to its base model: ``links`` (newest first), each with its job,
    config hash, datasets (id, sha256), loss and weights hashes and experiment."""

    object: str = "lineage"
    checkpoint: str
    base_model: str | None = None
    links: list[dict[str, Any]] = Field(default_factory=list)
    complete: bool = True


class BestCheckpoint(HasRequestMeta, _WithMeta):
    """The run's best checkpoint on a split (and benchmark, when one was named), accepted or unaudited."""

    object: str = "best_checkpoint"
    checkpoint: str
    split: str
    benchmark: str | None = None
    score: float
    experiment_id: str | None = None
    evaluation_job_id: str | None = None
    scores: dict[str, float] = Field(default_factory=dict)
    audit: str = "accepted"
    """``accepted``, or ``unaudited`` while the experiments it was ranked from await the audit."""


class Annotation(HasRequestMeta, _WithMeta):
    """The agent's own claim (``hypothesis``, ``finding``, ``review``), attributed to the key
    that wrote it; its kind's fields (``statement``, ``claim``, ``uncertainties`` …) are attributes."""

    id: str
    object: str = "annotation"
    kind: str
    key_id: str
    experiment_ids: list[str] = Field(default_factory=list)
    created_at: datetime | None = None


class ChainReport(HasRequestMeta, _WithMeta):
    """The verification of the run's event chain: ``ok`` is False when any event was changed,
    deleted or reordered, the tail truncated, the head forged or the chain rolled back behind its
    anchor outside the store (``problems``: ``status`` "broken"), or when the anchor could not
    vouch for the head (``status`` "unverifiable")."""

    object: str = "chain"
    run_id: str
    ok: bool
    status: str | None = None
    """intact | broken | unverifiable (None from a gym older than the anchor)."""
    events: int
    head_seq: int
    problems: list[dict[str, Any]] = Field(default_factory=list)
    anchor: dict[str, Any] = Field(default_factory=dict)
