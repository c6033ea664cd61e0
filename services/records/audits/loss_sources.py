"""Custom losses a run trained with, as texts the contamination audit scans next to its datasets.

A custom loss (services/training/loss_sandbox.py) shapes training as much as a dataset does, and
its source can carry data — the answers themselves, as text, bytes, base64 or token ids it pushes
the logits toward. So each distinct loss source a run's jobs used is training input of its own,
scanned against every benchmark task like a dataset, as three rows:

1. the source as written: comments, docstrings, code;
2. its literals as Python reads them (escapes decoded, bytes as UTF-8), in source order and joined
   by spaces, so a question cut into pieces across literals reads whole again; a literal that looks
   like base64 also as what it decodes to;
3. every literal sequence of integers (a list, tuple or set of two or more int constants) as the
   text it stands for: decoded with the job's base-model tokenizer (training input given as token
   ids) and as Unicode code points.

The source comes from the job's row, which keeps its request whole (``training_jobs.config``), and
must hash to the ``loss_module_hash`` the job recorded on the run's chain (``training.job``); one
that does not, or a recorded loss whose job is gone, leaves the check inconclusive. A loss whose
integer sequences cannot be decoded (the base model's tokenizer will not load) does too: the audit
does not pass what it could not read. Out of reach of an n-gram scan: data the loss computes at run
time (decrypted, generated) — the scan reads literals, not programs.
"""

from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from services.records.events import TRAINING_JOB
from services.training import read as training_read

if TYPE_CHECKING:
    from services.records.audits.context import AuditContext

LOSS_PREFIX = "loss:"
"""What a loss is keyed by where datasets are keyed by their sha256 (``loss:<sha256 of its source>``)."""
_BASE64 = re.compile(r"[A-Za-z0-9+/_\-\s]{16,}={0,2}")


@dataclass
class LossSource:
    sha256: str
    source: str
    base_model: str
    jobs: list[str] = field(default_factory=list)
    experiments: set[str] = field(default_factory=set)

    @property
    def label(self) -> str:
        """How findings name it: ``custom_loss:<the first job that used it>``."""
        return f"custom_loss:{self.jobs[0]}"

    @property
    def key(self) -> str:
        return LOSS_PREFIX + self.sha256


def run_losses(ctx: AuditContext) -> tuple[list[LossSource], list[str]]:
    """Every distinct custom loss the run's training jobs used, and what could not be read (each a
    sentence: a source that does not hash to what its job recorded, a recorded job that is gone)."""
    recorded: dict[str, str] = {}
    for e in ctx.run_events(TRAINING_JOB):
        if e.data.get("loss_module_hash"):
            recorded[str(e.data.get("job_id"))] = str(e.data["loss_module_hash"])
    with ctx.store.transaction() as s:
        jobs = training_read.run_jobs(s, ctx.run_id)
    problems: list[str] = []
    found: dict[str, LossSource] = {}
    seen = set()
    for job in jobs:
        seen.add(job.id)
        want = job.loss_module_hash or recorded.get(job.id)
        if not want:
            continue
        source = job.config.get("custom_loss")
        got = hashlib.sha256(source.encode()).hexdigest() if isinstance(source, str) else None
        if got != want or recorded.get(job.id, want) != want:
            problems.append(f"training job {job.id}: its stored custom loss does not hash to the "
                            f"{recorded.get(job.id, want)[:12]}… it recorded")
            continue
        loss = found.setdefault(want, LossSource(want, str(source), job.base_model))
        loss.jobs.append(job.id)
        if job.experiment_id:
            loss.experiments.add(job.experiment_id)
    problems += [f"training job {j}: recorded with a custom loss, but its job is not in the store"
                 for j in recorded if j not in seen]
    return list(found.values()), problems


def loss_rows(loss: LossSource, tokenizer: Any) -> Iterator[tuple[str, int, str]]:
    """``(label, row, text)``: the rows of the module docstring. ``tokenizer`` decodes token ids
    (None: only as code points)."""
    yield loss.label, 1, loss.source
    texts, numbers = _literals(loss.source)
    decoded = [d for t in texts if (d := _base64_text(t)) is not None]
    yield loss.label, 2, " ".join(texts + decoded)
    parts = []
    for seq in numbers:
        if tokenizer is not None and all(0 <= i < len(tokenizer) for i in seq):
            parts.append(tokenizer.decode(seq))
        if all(0 <= i < 0x110000 and not 0xD800 <= i < 0xE000 for i in seq):
            parts.append("".join(map(chr, seq)))
    yield loss.label, 3, " ".join(parts)


def has_token_ids(loss: LossSource) -> bool:
    """Whether the source holds integer sequences (that only its base model's tokenizer can read)."""
    return bool(_literals(loss.source)[1])


def _literals(source: str) -> tuple[list[str], list[list[int]]]:
    """The string and bytes literals, and the literal integer sequences, in source order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return [], []
    texts: list[tuple[tuple[int, int], str]] = []
    numbers: list[tuple[tuple[int, int], list[int]]] = []
    for node in ast.walk(tree):
        at = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append((at, node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            texts.append((at, node.value.decode("utf-8", "replace")))
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) >= 2 and all(
                isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
            numbers.append((at, [int(e.value) for e in node.elts if isinstance(e, ast.Constant)
                                 and isinstance(e.value, int)]))
    texts.sort(key=lambda t: t[0])
    numbers.sort(key=lambda n: n[0])
    return [t for _, t in texts], [n for _, n in numbers]


def _base64_text(text: str) -> str | None:
    """What a base64-looking literal decodes to, when that is UTF-8 text."""
    if not _BASE64.fullmatch(text.strip()):
        return None
    raw = re.sub(r"\s", "", text)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            return decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            continue
    return None


def loss_tokenizer(ctx: AuditContext, loss: LossSource) -> tuple[Any, str | None]:
    """The tokenizer of the loss's base model when its source holds integer sequences (None when
    it holds none), or why it could not be loaded."""
    if not has_token_ids(loss):
        return None, None
    try:
        from kit.settings import default_models_dir
        from services.models.loading import load_tokenizer, resolve_model_dir

        base = ctx.config.base_model(loss.base_model)
        if base is None:
            raise LookupError(f"base model {loss.base_model!r} is no longer configured")
        return load_tokenizer(str(resolve_model_dir(base, ctx.models_dir or default_models_dir()))), None
    except Exception as err:  # noqa: BLE001 - whatever stops it, the loss's ids stay unread: inconclusive
        return None, (f"{loss.label}: its integer sequences cannot be read as token ids, the tokenizer of "
                      f"{loss.base_model} did not load ({type(err).__name__}: {str(err)[:200]})")


def lineage_losses(ctx: AuditContext, checkpoint_id: str | None) -> set[str]:
    """The keys (``loss:<sha256>``) of the custom losses any link of the checkpoint's chain was
    trained with, from the checkpoint registry."""
    from services.training.checkpoints import Checkpoint

    keys: set[str] = set()
    seen: set[str] = set()
    current = checkpoint_id
    with ctx.store.transaction() as s:
        while current and current not in seen and len(seen) < 1000:
            seen.add(current)
            row = s.get(Checkpoint, current)
            if row is None:
                break
            if row.loss_module_hash:
                keys.add(LOSS_PREFIX + row.loss_module_hash)
            current = row.parent_checkpoint_id
    return keys
