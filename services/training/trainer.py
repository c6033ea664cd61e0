"""The local trainer: LoRA fine-tuning with torch + peft, on CUDA when there is one.

One step = one batch. Before each step the job reserves that step's cost (tokens × the base
model's training price) through the ledger; when it cannot, the job stops fail-closed and
keeps its last checkpoint. Nothing is charged for a step that did not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.core.errors import BudgetExhausted
from services.core.ledger import StepMeter
from services.core.money import token_cost_nusd
from services.training.batching import IGNORE, encode_examples, iterate_batches
from services.training.loss_sandbox import CustomLossError, LossSandbox
from services.training.schemas import JobRequest


@dataclass
class StepReport:
    step: int
    loss: float
    lr: float
    tokens: int
    grad_norm: float
    cost_nusd: int


@dataclass
class TrainOutcome:
    status: str  # succeeded | cancelled | budget_exhausted | failed
    steps: int
    error: str | None = None


def _scheduler(optimizer: Any, kind: str, total: int) -> Any:
    import torch

    if kind == "linear":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / total))
    if kind == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)


def total_steps(request: JobRequest, rows: int, max_steps: int) -> int:
    steps = request.steps or math.ceil((request.epochs or 1) * rows / request.batch_size)
    return max(1, min(steps, max_steps))


def train_lora(
    *,
    model_dir: str,
    parent_adapter: str | None,
    pairs: list[tuple[str, str]],
    request: JobRequest,
    steps: int,
    train_usd_per_mtok: float,
    meter: StepMeter,
    on_step: Callable[[StepReport], None],
    on_checkpoint: Callable[[Any, int, dict[str, Any]], None],
    should_stop: Callable[[], bool],
    loss_sandbox: LossSandbox | None,
    device: str = "cpu",
) -> TrainOutcome:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from services.models.loading import load_model, load_tokenizer

    torch.manual_seed(request.seed)
    tokenizer = load_tokenizer(model_dir)
    base = load_model(model_dir, device)
    if parent_adapter:
        model = PeftModel.from_pretrained(base, parent_adapter, is_trainable=True)
    else:
        lora = request.lora
        model = get_peft_model(base, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    model.train()
    rows = encode_examples(tokenizer, pairs, request.max_length)
    if not rows:
        return TrainOutcome("failed", 0, "no example has an answer within max_length tokens")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=request.learning_rate)
    scheduler = _scheduler(optimizer, request.schedule, steps)
    batches = iterate_batches(rows, request.batch_size, seed=request.seed, pad_id=tokenizer.pad_token_id)
    done, last_saved, last_loss = 0, 0, float("nan")

    def checkpoint() -> None:
        nonlocal last_saved
        if done > last_saved:
            model.eval()
            on_checkpoint(model, done, {"loss": last_loss})
            model.train()
            last_saved = done

    status, error = "succeeded", None
    try:
        for step in range(1, steps + 1):
            if should_stop():
                status = "cancelled"
                break
            batch = {k: v.to(device) for k, v in next(batches).items()}
            tokens = int(batch["attention_mask"].sum())
            cost = token_cost_nusd(tokens, train_usd_per_mtok)
            with meter.step(cost) as paid:
                if loss_sandbox is None:
                    loss = model(**batch).loss
                    loss.backward()
                else:
                    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                    logits = out.logits[:, :-1]
                    labels = batch["labels"][:, 1:]
                    mask = labels != IGNORE
                    loss, grad = loss_sandbox(logits, labels, mask)
                    logits.backward(grad.to(logits.dtype).to(device))
                paid.performed = True
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                paid.actual_nusd = cost
            done, last_loss = step, float(loss.detach())
            on_step(StepReport(step, last_loss, scheduler.get_last_lr()[0], tokens, grad_norm, cost))
            if step % request.checkpoint_every == 0:
                checkpoint()
    except BudgetExhausted:
        status = "budget_exhausted"
        error = f"the budget could not pay for step {done + 1}; stopped after {done} steps"
    except CustomLossError as err:
        status, error = "failed", f"step {done + 1}: {err}"
    checkpoint()
    return TrainOutcome(status, done, error)
