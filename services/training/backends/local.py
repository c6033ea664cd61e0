"""The local trainer: LoRA fine-tuning with torch + peft on this host, on CUDA when there is one.

Base models served by vLLM train here too: vLLM only serves their PEFT checkpoints.
torch and peft are imported when a job prepares, never at import time.

Every checkpoint also writes the trainer's state (``save_state``: AdamW's moments and step
counts, the LR schedule's position, the torch RNG states); a job resumed on another worker
loads the checkpoint's adapter and that state, and skips the batches it had taken (the batch
order is a function of the seed), so its loss curve continues where it stopped.

A job from a parent checkpoint continues the parent's adapter when its ``lora`` settings are the
adapter's; otherwise it trains a new adapter with its own settings over the base with the
parent's adapter merged in, and its checkpoints are the two concatenated (``lora_stack.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.training.backends import TRAINERS, TrainerSetup
from services.training.backends.lora_stack import (
    StackedAdapter,
    lora_view,
    parent_lora,
    require_stackable,
    same_settings,
)
from services.training.batching import IGNORE, encode_examples, iterate_batches
from services.training.loss_sandbox import CustomLossError
from services.training.trainer import Paid, StepResult, TrainerError, TrainingInputs, lr_factor

STATE_FILE = "trainer_state.pt"
CHILD_DIR = "stacked_adapter"
"""In a stacked job's state: the new adapter alone (its checkpoint holds it concatenated to the parent's)."""


class LocalTrainer:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self.model: Any = None
        self.stack: tuple[str, Any, Any] | None = None
        """(parent adapter dir, its LoraConfig, the new adapter's) when the job stacks a new LoRA."""
        self.parent_id: str | None = None

    def prepare(self, inputs: TrainingInputs) -> None:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model

        from services.models.loading import load_model, load_tokenizer

        request = inputs.request
        torch.manual_seed(request.seed)
        tokenizer = load_tokenizer(inputs.model_dir)
        rows = encode_examples(tokenizer, inputs.pairs, request.max_length)
        if not rows:
            raise TrainerError("no example has an answer within max_length tokens")
        base = load_model(inputs.model_dir, self.device)
        resume = inputs.resume if inputs.resume is not None and inputs.resume.step > 0 else None
        lora = request.lora
        alpha: Any = lora.alpha  # peft annotates an int; it scales by any float
        config = LoraConfig(r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout,
                            target_modules=lora.target_modules, task_type="CAUSAL_LM")
        parent = parent_lora(inputs.parent_adapter) if inputs.parent_adapter else None
        self.stack, self.parent_id = None, request.parent_checkpoint
        if parent is not None and inputs.parent_adapter and not same_settings(parent, lora):
            # Another LoRA than the parent's: a new adapter over base + Δparent (lora_stack.py).
            require_stackable(parent, "parent")
            merged = PeftModel.from_pretrained(base, inputs.parent_adapter).merge_and_unload()
            merged.__dict__.pop("peft_config", None)  # peft leaves it behind; the merged model is a plain base
            self.stack = (inputs.parent_adapter, parent, config)
            if resume is not None:  # the new adapter alone was saved with the trainer's state
                alone = Path(resume.state or "") / CHILD_DIR
                if not resume.state or not (alone / "adapter_config.json").is_file():
                    raise TrainerError(f"cannot resume: the stacked adapter saved at step {resume.step} is missing")
                model = PeftModel.from_pretrained(merged, str(alone), is_trainable=True)
            else:
                model = get_peft_model(merged, config)
        elif adapter := (resume.adapter if resume is not None else inputs.parent_adapter):
            model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
        else:
            model = get_peft_model(base, config)
        model.train()
        self.model, self.loss_sandbox = model, inputs.loss_sandbox
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=request.learning_rate)
        total = inputs.steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(request.schedule, s, total))
        self._restored = "nothing (the job starts again from its input; the batch order is the same)"
        if resume is not None:
            self._load_state(resume.state, resume.step)
        self.batches = iterate_batches(rows, request.batch_size, seed=request.seed, pad_id=tokenizer.pad_token_id,
                                       skip=resume.step if resume is not None else 0)

    def _load_state(self, state_dir: str | None, step: int) -> None:
        import torch

        path = Path(state_dir or "") / STATE_FILE
        if not state_dir or not path.is_file():
            raise TrainerError(f"cannot resume: the trainer state saved at step {step} is missing")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
            if torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(state["cuda_rng"])
        except (OSError, RuntimeError, KeyError, ValueError) as err:
            raise TrainerError(f"cannot resume from the state saved at step {step}: {type(err).__name__}: {err}") from err
        self._restored = (f"the adapter of step {step}, AdamW's state, the LR schedule, the torch RNG and "
                          f"the batch order (the {step} batches taken skipped)")

    def restored(self) -> str:
        return self._restored

    def next_batch(self) -> dict[str, Any]:
        return {k: v.to(self.device) for k, v in next(self.batches).items()}

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        return int(batch["attention_mask"].sum())

    def step(self, batch: dict[str, Any], step: int, paid: Paid) -> StepResult:
        import torch

        self.model.train()
        if self.loss_sandbox is None:
            loss = self.model(**batch).loss
            loss.backward()
        else:
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            logits = out.logits[:, :-1]
            labels = batch["labels"][:, 1:]
            try:
                loss, grad = self.loss_sandbox(logits, labels, labels != IGNORE)
            except CustomLossError as err:
                raise TrainerError(str(err)) from err
            logits.backward(grad.to(logits.dtype).to(self.device))
        paid.performed = True
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, 1.0))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(float(loss.detach()), float(self.scheduler.get_last_lr()[0]), grad_norm)

    def save(self, step: int) -> Any:
        self.model.eval()  # a PEFT model saves its adapter with save_pretrained
        if self.stack is None:
            return self.model
        parent_dir, parent, config = self.stack
        return StackedAdapter(parent_dir, parent, self.model, config, {"stacked": {
            "on": self.parent_id, "how": "a new LoRA trained over the base with the parent's adapter merged in; saved as their "
                   "concatenation (one adapter of rank parent + new)",
            "parent_lora": lora_view(parent), "lora": lora_view(config)}})

    def save_state(self, directory: Path) -> None:
        import torch

        directory.mkdir(parents=True, exist_ok=True)
        if self.stack is not None:  # a resume rebuilds base + Δparent and continues this adapter alone
            self.model.save_pretrained(str(directory / CHILD_DIR))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   directory / STATE_FILE)

    def close(self) -> None:
        self.model = None


@TRAINERS.register("local")
@TRAINERS.register("vllm")
def make_local(setup: TrainerSetup) -> LocalTrainer:
    return LocalTrainer(setup.device)
