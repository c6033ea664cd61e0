"""The training step loop, written once, and the ``Trainer`` protocol backends implement.

One step = one batch. Before each step the job reserves that step's cost (tokens × the base
model's training price) through the ledger; when it cannot, the job stops fail-closed with
``budget_exhausted`` and keeps its last checkpoint. Nothing is charged for a step that did
not run; a step is charged as soon as its backend says irreversible work has happened
(``paid.performed``), even if it then fails. A custom loss's wall seconds are priced on top
(the step reserves the loss's per-step cap) and billed whatever happens after they ran. Cancellation is checked before every step and
checkpoints are written every ``checkpoint_every`` steps and once at the end.

A job re-claimed after its worker died continues from its last checkpoint (:class:`Resume`):
the trainer reloads the checkpoint's weights and the state saved with it (``save_state``) and
takes the batches after it; the loop starts at the step after the checkpoint. Steps the dead
worker had already billed are run again *unmetered* (the platform pays for the lost work; the
agent paid for each step once) and report the cost they were billed; the steps after them are
metered as usual.

What differs between backends — loading the model, running one step, saving weights — sits
behind :class:`Trainer`: ``backends/local.py`` (torch + peft, on this host) and
``backends/tinker.py`` (remote GPUs). A backend is picked by the base model's ``backend``
through ``services.training.backends.TRAINERS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from billing.ledger import StepMeter
from billing.money import token_cost_nusd
from kit.errors import BudgetExhausted
from services.training.loss_sandbox import LossSandbox
from services.training.schemas import JobRequest


@dataclass
class StepReport:
    step: int
    loss: float
    lr: float
    tokens: int
    grad_norm: float
    cost_nusd: int
    loss_s: float | None = None
    """Wall seconds of the custom loss this step (billed in ``cost_nusd``); None without one."""
    replayed: bool = False
    """A step a dead worker had billed, run again unmetered after a resume (``cost_nusd``: what it was billed)."""


@dataclass
class TrainOutcome:
    status: str  # succeeded | cancelled | budget_exhausted | failed
    steps: int
    error: str | None = None


@dataclass
class Resume:
    """Where a job re-claimed after its worker died continues."""

    step: int
    """The checkpoint's step (0: no usable checkpoint, start again from the job's input); the
    loop continues at ``step + 1``."""
    adapter: str | None = None
    """The checkpoint's directory (its weights); None when ``step`` is 0."""
    state: str | None = None
    """The directory ``Trainer.save_state`` wrote at that checkpoint; None when ``step`` is 0."""
    billed_nusd: list[int] = field(default_factory=list)
    """What each step after ``step`` that the dead worker had billed cost, in order: those steps
    are run again unmetered."""


@dataclass
class TrainingInputs:
    """One job's work, as every backend receives it."""

    model_dir: str
    """The base model's local directory (its tokenizer at least; its weights for local training)."""
    parent_adapter: str | None
    """The parent checkpoint's directory, to continue from."""
    pairs: list[tuple[str, str]]
    request: JobRequest
    steps: int
    loss_sandbox: LossSandbox | None = None
    resume: Resume | None = None
    """Set when the job continues after its worker died (its ``parent_adapter`` is then superseded)."""


@dataclass
class StepResult:
    loss: float
    lr: float
    grad_norm: float


class TrainerError(Exception):
    """The job cannot go on: raised by ``prepare`` (fails the job before any step), by ``step``
    (fails it at that step) or by ``save`` (a checkpoint that could not be written)."""


class Paid(Protocol):
    performed: bool
    actual_nusd: int


class Trainer(Protocol):
    def prepare(self, inputs: TrainingInputs) -> None:
        """Load the model (or open the remote session) and encode the data; raise
        :class:`TrainerError` when the job cannot run at all."""
        ...

    def next_batch(self) -> Any:
        """The next batch, opaque to the loop."""
        ...

    def batch_tokens(self, batch: Any) -> int:
        """Tokens the step will process — what it is priced by, before it runs."""
        ...

    def step(self, batch: Any, step: int, paid: Paid) -> StepResult:
        """One optimiser step; sets ``paid.performed`` once the work cannot be taken back."""
        ...

    def save(self, step: int) -> Any:
        """The current weights as something with ``save_pretrained(dir)`` for the registry; it may
        carry ``checkpoint_metrics`` (a dict), added to the checkpoint's metrics."""
        ...

    def save_state(self, directory: Path) -> None:
        """Write into ``directory`` what ``prepare`` needs, with the checkpoint's weights, to continue
        exactly after this step on another worker (optimiser, schedule, RNG); a backend whose
        service keeps that state itself (Tinker's ``save_state``) writes nothing."""
        ...

    def restored(self) -> str:
        """After a resumed ``prepare``: what was restored, in words, for the job's log."""
        ...

    def close(self) -> None:
        ...


def lr_factor(kind: str, s: int, total: int) -> float:
    """The learning-rate schedule after ``s`` of ``total`` steps (a factor of the base rate)."""
    if kind == "linear":
        return max(0.0, 1 - s / total)
    if kind == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    return 1.0


def total_steps(request: JobRequest, rows: int, max_steps: int) -> int:
    steps = request.steps or math.ceil((request.epochs or 1) * rows / request.batch_size)
    return max(1, min(steps, max_steps))


def run_training(
    trainer: Trainer,
    inputs: TrainingInputs,
    *,
    train_usd_per_mtok: float,
    meter: StepMeter,
    on_step: Callable[[StepReport], None],
    on_checkpoint: Callable[[Any, int, dict[str, Any]], None],
    should_stop: Callable[[], bool],
) -> TrainOutcome:
    """Run ``inputs.steps`` metered steps of ``trainer`` (after ``inputs.resume.step`` when the job
    resumes); never raises for budget, cancel or backend failures — they are the outcome's status."""
    try:
        trainer.prepare(inputs)
    except TrainerError as err:
        trainer.close()
        return TrainOutcome("failed", 0, str(err))
    start = inputs.resume.step if inputs.resume else 0
    billed = list(inputs.resume.billed_nusd) if inputs.resume else []
    done, last_saved, last_loss = start, start, float("nan")

    def checkpoint() -> None:
        nonlocal last_saved
        if done > last_saved:
            saved = trainer.save(done)
            # What a backend says of the weights it saved (a stacked LoRA: what it stacks), with the loss.
            on_checkpoint(saved, done, {"loss": last_loss, **getattr(saved, "checkpoint_metrics", {})})
            last_saved = done

    status, error = "succeeded", None
    try:
        for step in range(start + 1, inputs.steps + 1):
            if should_stop():
                status = "cancelled"
                break
            batch = trainer.next_batch()
            tokens = trainer.batch_tokens(batch)
            clock = inputs.loss_sandbox
            if step - start <= len(billed):  # billed by the dead worker: run again, not billed again
                result = trainer.step(batch, step, _Unmetered())
                loss_s = clock.take_seconds() if clock is not None else None
                report = StepReport(step, result.loss, result.lr, tokens, result.grad_norm, billed[step - start - 1],
                                    None if loss_s is None else round(loss_s, 3), replayed=True)
            else:
                result, report = _metered_step(trainer, batch, step, tokens, train_usd_per_mtok, meter, clock)
            done, last_loss = step, result.loss
            on_step(report)
            if step % inputs.request.checkpoint_every == 0:
                checkpoint()
    except BudgetExhausted:
        status = "budget_exhausted"
        error = f"the budget could not pay for step {done + 1}; stopped after {done} steps"
    except TrainerError as err:
        status, error = "failed", f"step {done + 1}: {err}"
    try:
        checkpoint()
    except TrainerError as err:
        if status == "succeeded":
            status = "failed"
        error = f"{error}; " if error else ""
        error += f"the last checkpoint (step {done}) could not be saved: {err}"
    finally:
        trainer.close()
    return TrainOutcome(status, done, error)


@dataclass
class _Unmetered:
    """The ``paid`` of a replayed step: nothing is reserved or settled for it."""

    performed: bool = False
    actual_nusd: int = 0


def _metered_step(trainer: Trainer, batch: Any, step: int, tokens: int, train_usd_per_mtok: float, meter: StepMeter,
                  clock: LossSandbox | None) -> tuple[StepResult, StepReport]:
    """One step, its cost reserved before it runs and settled after (see the module's docstring)."""
    cost = token_cost_nusd(tokens, train_usd_per_mtok)
    loss_s: float | None = None
    with meter.step(cost + (clock.cap_nusd if clock else 0)) as paid:
        ok = False
        try:
            result = trainer.step(batch, step, paid)
            ok = True
        finally:
            token_part = cost if ok or paid.performed else 0
            loss_nusd = 0
            if clock is not None:
                loss_s = clock.take_seconds()
                loss_nusd = clock.cost_nusd(loss_s)
                paid.performed = paid.performed or loss_s > 0  # its seconds are spent, whatever follows
            paid.actual_nusd = token_part + loss_nusd
    return result, StepReport(step, result.loss, result.lr, tokens, result.grad_norm, paid.actual_nusd,
                              None if loss_s is None else round(loss_s, 3))
