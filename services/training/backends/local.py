"""The local trainer: LoRA fine-tuning with torch + peft on this host, on CUDA when there is one.

Base models served by vLLM train here too: vLLM only serves their PEFT checkpoints.
torch and peft are imported when a job prepares, never at import time.
"""

from __future__ import annotations

from typing import Any

from services.training.backends import TRAINERS, TrainerSetup
from services.training.batching import IGNORE, encode_examples, iterate_batches
from services.training.loss_sandbox import CustomLossError
from services.training.trainer import Paid, StepResult, TrainerError, TrainingInputs, lr_factor


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
        if inputs.parent_adapter:
            model = PeftModel.from_pretrained(base, inputs.parent_adapter, is_trainable=True)
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
        self.batches = iterate_batches(rows, request.batch_size, seed=request.seed, pad_id=tokenizer.pad_token_id)

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

    def close(self) -> None:
        self.model = None


@TRAINERS.register("local")
@TRAINERS.register("vllm")
def make_local(setup: TrainerSetup) -> LocalTrainer:
    return LocalTrainer(setup.device)
