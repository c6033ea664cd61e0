"""LoRA training on Tinker (remote GPUs): a ``Trainer`` driven by the shared step loop
(services/training/trainer.py), so it is metered step by step exactly like the local trainer.

The data are tokenized here with the base model's *local* tokenizer (Tinker's own
``get_tokenizer`` downloads from a model hub, which a gym may not reach) and sent as
``Datum``s: the input tokens, the next-token targets and a weight per target (1 on the answer,
0 on the prompt). One step is one ``forward_backward(data, "cross_entropy")`` followed by one
``optim_step(AdamParams)``. Before each step the job reserves that step's cost through the
ledger (tokens × the base model's training price — the same tokens, so the same price, as the
local trainer); when the budget cannot pay, the job stops fail-closed with
``budget_exhausted`` and keeps its last checkpoint. A step counts as performed — and is
charged even if it then fails — as soon as Tinker has accepted its forward/backward request.

A checkpoint is Tinker's: ``save_weights_for_sampler`` (servable, ``tinker://…``) and
``save_state`` (to continue from). The registry stores a small directory holding
``tinker.json`` with both paths, so weights hashes and provenance work unchanged and the
Tinker inference engine can sample from it. A job resumed after its worker died opens a new
training client on the last checkpoint's ``save_state`` path (``load_state_with_optimizer``:
weights and Adam's moments; a client without it: weights only, and the job's log says so) and
skips the batches it had taken; a checkpoint without a saved state cannot be resumed and the
job fails, saying so.

The client boundary is duck-typed: ``client`` is a ``tinker.ServiceClient`` or anything shaped
like one (``tests/fakes/fake_tinker.py``); the request types, the checkpoint manifest and the
service client are shared with inference (services/models/tinker_client.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit.errors import BudgetExhausted
from services.models.tinker_client import MANIFEST_FORMAT, TinkerWeights, tinker_manifest, tinker_types
from services.training.backends import TRAINERS, TrainerSetup
from services.training.batching import IGNORE, encode_examples, shuffled_chunks
from services.training.trainer import Paid, StepResult, TrainerError, TrainingInputs, lr_factor

ATTN_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP_MODULES = {"gate_proj", "up_proj", "down_proj"}


def to_list(value: Any) -> list[Any]:
    """A TensorData, tensor, array or list as a plain list."""
    if hasattr(value, "tolist"):
        return list(value.tolist())
    if hasattr(value, "data") and isinstance(value.data, list):
        return list(value.data)
    return list(value)


def make_datum(ids: list[int], labels: list[int]) -> Any:
    """One supervised example: predict ``ids[1:]`` from ``ids[:-1]``, weighted on the answer only."""
    t = tinker_types()
    targets = ids[1:]
    weights = [0.0 if label == IGNORE else 1.0 for label in labels[1:]]
    n = len(targets)
    return t.Datum(model_input=t.ModelInput.from_ints(tokens=ids[:-1]),
                   loss_fn_inputs={"target_tokens": t.TensorData(data=targets, dtype="int64", shape=[n]),
                                   "weights": t.TensorData(data=weights, dtype="float32", shape=[n])})


# -- the trainer --------------------------------------------------------------------------


class TinkerFailure(TrainerError):
    """A call to the Tinker service failed (network, service error, bad answer)."""


def _remote(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BudgetExhausted:
        raise
    except Exception as err:
        raise TinkerFailure(f"tinker {what} failed: {type(err).__name__}: {err}") from err


def _loss_of(output: Any, data: list[Any]) -> float:
    """Mean NLL over answer tokens: ``loss:sum`` / total weight (or recomputed from logprobs)."""
    weights = [to_list(d.loss_fn_inputs["weights"]) for d in data]
    total = sum(sum(w) for w in weights) or 1.0
    metrics = getattr(output, "metrics", None) or {}
    if "loss:sum" in metrics:
        return float(metrics["loss:sum"]) / total
    outputs = getattr(output, "loss_fn_outputs", None) or []
    nll = 0.0
    for out, w in zip(outputs, weights, strict=False):
        logprobs = to_list(out["logprobs"])
        nll -= sum(lp * wi for lp, wi in zip(logprobs, w, strict=False))
    return nll / total


def _grad_norm(*outputs: Any) -> float:
    for out in outputs:
        for key, value in (getattr(out, "metrics", None) or {}).items():
            if "grad_norm" in key:
                return float(value)
    return 0.0  # Tinker does not always report it; the column is not nullable


Batch = list[tuple[list[int], list[int]]]


class TinkerTrainer:
    """:class:`services.training.trainer.Trainer` on a Tinker ``ServiceClient``."""

    def __init__(self, client: Any, tinker_base_model: str):
        self.client, self.tinker_base_model = client, tinker_base_model

    def prepare(self, inputs: TrainingInputs) -> None:
        from services.models.loading import load_tokenizer

        request = inputs.request
        if inputs.loss_sandbox is not None or request.loss != "cross_entropy":
            raise TrainerError("the tinker backend trains with cross_entropy only; custom losses need the local backend")
        if not self.tinker_base_model:
            raise TrainerError("the base model has no tinker_base_model configured")
        rank = request.lora.rank
        parent: dict[str, Any] | None = None
        resume = inputs.resume if inputs.resume is not None and inputs.resume.step > 0 else None
        adapter = resume.adapter if resume is not None else inputs.parent_adapter
        if adapter:
            try:
                parent = tinker_manifest(adapter)
            except ValueError as err:
                raise TrainerError(str(err)) from err
            if parent is None:
                raise TrainerError("the parent checkpoint was not trained on tinker; tinker cannot continue it")
            if parent.get("base_model") != self.tinker_base_model:
                raise TrainerError(f"the parent checkpoint was trained on {parent.get('base_model')!r}, "
                                   f"not {self.tinker_base_model!r}")
            if not parent.get("state_path"):
                raise TrainerError(f"cannot resume: the checkpoint of step {resume.step} has no tinker training state"
                                   if resume is not None else
                                   "the parent checkpoint has no tinker training state to continue from")
            rank = int(parent.get("rank") or rank)
        tokenizer = load_tokenizer(inputs.model_dir)
        rows = [(ids, labels) for ids, labels in encode_examples(tokenizer, inputs.pairs, request.max_length)
                if len(ids) >= 2 and any(label != IGNORE for label in labels[1:])]
        if not rows:
            raise TrainerError("no example has an answer within max_length tokens")
        targets = set(request.lora.target_modules)
        self.training = _remote("creating a LoRA training client", lambda: self.client.create_lora_training_client(
            base_model=self.tinker_base_model, rank=rank, seed=request.seed,
            train_attn=bool(targets & ATTN_MODULES) or not (targets & MLP_MODULES),
            train_mlp=bool(targets & MLP_MODULES), train_unembed=False))
        self._restored = "nothing (the job starts again from its input; the batch order is the same)"
        if parent is not None:
            state_path = parent["state_path"]
            with_optimizer = getattr(self.training, "load_state_with_optimizer", None)
            if resume is not None and with_optimizer is not None:
                _remote("loading the checkpoint's training state", lambda: with_optimizer(state_path).result())
                self._restored = (f"the weights and Adam's state of step {resume.step} (tinker load_state_with_optimizer) "
                                  f"and the batch order")
            else:
                _remote("loading the parent checkpoint", lambda: self.training.load_state(state_path).result())
                if resume is not None:
                    self._restored = (f"the weights of step {resume.step} only: this tinker client cannot load the "
                                      f"optimizer state, so Adam's moments start again; and the batch order")
        self.rank, self.request, self.total = rank, request, inputs.steps
        skip = resume.step if resume is not None else 0
        self.batches = itertools.islice(shuffled_chunks(rows, request.batch_size, seed=request.seed), skip, None)

    def restored(self) -> str:
        return self._restored

    def next_batch(self) -> Batch:
        return next(self.batches)

    def batch_tokens(self, batch: Batch) -> int:
        return sum(len(ids) for ids, _ in batch)  # what the local trainer counts (its attention mask)

    def step(self, batch: Batch, step: int, paid: Paid) -> StepResult:
        t = tinker_types()
        data = [make_datum(ids, labels) for ids, labels in batch]
        lr = self.request.learning_rate * lr_factor(self.request.schedule, step - 1, self.total)
        fwd = _remote("forward_backward", lambda: self.training.forward_backward(data, loss_fn="cross_entropy"))
        paid.performed = True  # accepted upstream: from here the service may bill us, so we bill
        opt = _remote("optim_step", lambda: self.training.optim_step(
            t.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.999, eps=1e-8)))
        fwd_out = _remote("forward_backward", fwd.result)
        opt_out = _remote("optim_step", opt.result)
        return StepResult(_loss_of(fwd_out, data), lr, _grad_norm(opt_out, fwd_out))

    def save(self, step: int) -> TinkerWeights:
        name = f"step-{step:06d}"
        sampler_path = str(_remote("saving weights for the sampler",
                                   lambda: self.training.save_weights_for_sampler(name).result().path))
        state_path = None
        if hasattr(self.training, "save_state"):
            state_path = str(_remote("saving the training state", lambda: self.training.save_state(name).result().path))
        return TinkerWeights({"format": MANIFEST_FORMAT, "base_model": self.tinker_base_model, "path": sampler_path,
                              "state_path": state_path, "rank": self.rank, "step": step})

    def save_state(self, directory: Path) -> None:
        """Nothing here: the state to resume from is Tinker's, its path in the checkpoint's manifest."""

    def close(self) -> None:
        self.training = None


@TRAINERS.register("tinker")
def make_tinker(setup: TrainerSetup) -> TinkerTrainer:
    return TinkerTrainer(setup.tinker_client, setup.base.tinker_base_model or "")

