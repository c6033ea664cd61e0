"""The local trainer: LoRA fine-tuning with torch + peft on this host, on CUDA when there is one.

Base models served by vLLM train here too: vLLM only serves their PEFT checkpoints.
torch and peft are imported when a job prepares, never at import time.

Every checkpoint also writes the trainer's state (``save_state``: AdamW's moments and step
counts, the LR schedule's position, the torch RNG states); a job resumed on another worker
loads the checkpoint's adapter and that state, and skips the batches it had taken (the batch
order is a function of the seed), so its loss curve continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.training.backends import TRAINERS, TrainerSetup
from services.training.batching import IGNORE, encode_examples, iterate_batches
from services.training.loss_sandbox import CustomLossError
from services.training.trainer import Paid, StepResult, TrainerError, TrainingInputs, lr_factor

STATE_FILE = "trainer_state.pt"


class LocalTrainer:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self.model: Any = None

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
        adapter = resume.adapter if resume is not None else inputs.parent_adapter
        if adapter:
            model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
        else:
            lora = request.lora
            alpha: Any = lora.alpha  # peft annotates an int; it scales by any float
            model = get_peft_model(base, LoraConfig(r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout,
                                                    target_modules=lora.target_modules, task_type="CAUSAL_LM"))
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
        return self.model

    def save_state(self, directory: Path) -> None:
        import torch

        directory.mkdir(parents=True, exist_ok=True)
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
