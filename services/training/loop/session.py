"""One Tinker training client: a base model with a fresh LoRA adapter and its AdamW state.

The wire layer (services/training/tinker_api/) maps the SDK's calls onto :class:`LoopSession`
one to one and serialises them per session (the SDK orders a client's requests; the session
also takes a lock, so a stray concurrent call waits instead of interleaving with a backward):

* ``forward`` / ``forward_backward(data, loss_fn, loss_fn_config)`` — one padded batch per
  ``max_batch_tokens`` (right padding, masked out of the loss); ``forward_backward`` adds its
  gradients to those already there, so several calls before one ``optim_step`` accumulate, as
  on Tinker. Losses and their inputs: ``losses``.
* ``forward_backward_custom(data, loss)`` — Tinker's custom loss: ``loss(data, logprobs)`` gets
  one ``requires_grad`` tensor of target log-probabilities per datum and returns
  ``(loss, metrics)``; its gradient flows straight into the weights (the SDK reaches the same
  gradient with a forward pass and a linear surrogate; here one backward does it).
* ``optim_step(AdamParams)`` — AdamW (decoupled weight decay, optional global-norm clipping)
  with that step's hyperparameters, then the gradients are cleared.
* ``sample`` — from the current weights (``sampling``); ``load_sampler`` makes a sampling
  client on a saved adapter with the same code.
* ``save_weights_for_sampler(dir)`` — the PEFT adapter directory (``adapter_config.json`` +
  ``adapter_model.safetensors``) that the gym's training jobs write and its inference serves.
  ``save_state(dir)`` writes the same plus ``loop_state.pt`` (AdamW's moments and step counts,
  the sampling RNG's state, the step and token counters); ``load_state(dir, with_optimizer=...)``
  restores the weights and, when asked, AdamW's state, the sampling RNG and the step count
  (without it the optimizer starts fresh, as Tinker's ``load_state`` does against
  ``load_state_with_optimizer``). The token meter is the session's own and is not rolled back.
  Nothing here draws from torch's global RNG (sampling has its own generator, the model no
  dropout), so sessions in one process do not disturb each other.

The LoRA: rank ``rank``, alpha 32, no dropout, on the attention projections (``train_attn``),
the MLP projections (``train_mlp``) and the output head (``train_unembed``) — Tinker's
``LoraConfig`` switches. Its initialisation is a function of ``seed`` (B is zero, so a fresh
adapter computes exactly the base model). The model stays in eval mode: nothing in it is
stochastic, so ``forward`` and ``forward_backward`` return the same log-probabilities.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from kit.errors import Conflict, NotFound, Unprocessable
from services.models.loading import load_model, load_tokenizer
from services.training.loop.losses import INT_INPUTS, check_data, resolve_config
from services.training.loop.sampling import generate
from services.training.loop.types import AdamParams, Datum, ForwardResult, Meter, SampledSequence, SamplingParams

STATE_FILE = "loop_state.pt"
LORA_ALPHA = 32
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)

CustomLoss = Callable[[list[Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class _Model:
    """A loaded base (+ adapter) with what sampling and batching need to know of it."""

    def __init__(self, base_path: Path, device: str):
        self.device = device
        self.tokenizer = load_tokenizer(str(base_path))
        self.model: Any = load_model(str(base_path), device)
        config = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        eos = config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(int(self.tokenizer.eos_token_id))
        self.eos_ids = sorted(eos_ids)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)

    def sample(self, prompt_tokens: list[int], num_samples: int, params: SamplingParams,
               generator: torch.Generator) -> list[SampledSequence]:
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        return generate(self.model, self.tokenizer, prompt_tokens, num_samples, params, generator=generator,
                        eos_ids=self.eos_ids, vocab_size=self.vocab_size, max_positions=self.max_positions,
                        device=self.device)


class LoopSampler:
    """A sampling client on saved weights: the base model with a saved adapter, frozen."""

    def __init__(self, base_path: Path, adapter_dir: Path, device: str = "cpu", seed: int | None = None):
        from peft import PeftModel

        if not (Path(adapter_dir) / "adapter_config.json").is_file():
            raise NotFound(f"no adapter at {adapter_dir}")
        self._m = _Model(base_path, device)
        self._m.model = PeftModel.from_pretrained(self._m.model, str(adapter_dir)).eval()
        self._generator = torch.Generator(device).manual_seed(secrets.randbits(63) if seed is None else seed)
        self._lock = threading.Lock()
        self.meter = Meter()

    def sample(self, prompt_tokens: list[int], num_samples: int, params: SamplingParams) -> list[SampledSequence]:
        with self._lock:
            out = self._m.sample(prompt_tokens, num_samples, params, self._generator)
            self.meter.prefill += len(prompt_tokens) * num_samples
            self.meter.sampled += sum(len(s.tokens) for s in out)
            return out

    def tokens_seen(self) -> int:
        return self.meter.total()

    def close(self) -> None:
        self._m.model = None


class LoopSession:
    """One LoRA training client: a base model with a fresh LoRA adapter (``rank``), its AdamW
    optimizer state, on ``device``."""

    def __init__(self, *, base_path: Path, rank: int = 32, seed: int | None = None, device: str = "cpu",
                 train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = False,
                 max_batch_tokens: int = 4096):
        from peft import LoraConfig, get_peft_model

        if rank < 1:
            raise Unprocessable("rank must be at least 1", param="rank")
        self.seed = secrets.randbits(63) if seed is None else seed
        self.rank = rank
        self.max_batch_tokens = max_batch_tokens
        self._m = _Model(base_path, device)
        base = self._m.model
        wanted = ((ATTN_MODULES if train_attn else ()) + (MLP_MODULES if train_mlp else ())
                  + (UNEMBED_MODULES if train_unembed else ()))
        present = {name.rsplit(".", 1)[-1] for name, module in base.named_modules()
                   if isinstance(module, torch.nn.Linear)}
        self.target_modules = sorted(m for m in wanted if m in present)
        if not self.target_modules:
            raise Unprocessable("the LoRA would train nothing: enable train_attn, train_mlp or train_unembed",
                                param="lora_config")
        alpha: Any = LORA_ALPHA  # peft annotates an int; it scales by any number
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=self.target_modules,
                            task_type="CAUSAL_LM")
        with torch.random.fork_rng(devices=[]):  # the adapter's init is a function of the seed alone
            torch.manual_seed(self.seed)
            self._m.model = get_peft_model(base, config).eval()
        self.params = [p for p in self._m.model.parameters() if p.requires_grad]
        self.optimizer = self._new_optimizer()
        self._generator = torch.Generator(device).manual_seed(self.seed)
        self._lock = threading.RLock()
        self.steps = 0
        self.meter = Meter()

    # -- training ---------------------------------------------------------------------------------

    def forward(self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None) -> ForwardResult:
        """The loss and per-token log-probabilities, without gradients."""
        with self._lock:
            result = self._run(data, loss_fn, loss_fn_config, backward=False)
            self.meter.forward += sum(len(d.tokens) for d in data)
            return result

    def forward_backward(self, data: list[Datum], loss_fn: str,
                         loss_fn_config: dict[str, Any] | None = None) -> ForwardResult:
        """As ``forward``, and the loss's gradients added to the adapter's."""
        with self._lock:
            result = self._run(data, loss_fn, loss_fn_config, backward=True)
            self.meter.train += sum(len(d.tokens) for d in data)
            return result

    def forward_backward_custom(self, data: list[Datum], loss: CustomLoss) -> ForwardResult:
        """Tinker's custom loss over per-datum target log-probabilities (``target_tokens`` needed;
        the other inputs are the callable's to read)."""
        with self._lock:
            self._check_open()
            if not data:
                raise Unprocessable("data is empty", param="data")
            for i, d in enumerate(data):
                targets = d.loss_fn_inputs.get("target_tokens")
                if targets is None or len(targets) != len(d.tokens):
                    raise Unprocessable(f"data[{i}]: loss_fn_inputs.target_tokens must be as long as model_input",
                                        param="loss_fn_inputs.target_tokens")
            logprobs: list[torch.Tensor] = []
            for chunk in self._chunks(data):
                logp, _ = self._logprobs([data[i].tokens for i in chunk],
                                         [[int(t) for t in data[i].loss_fn_inputs["target_tokens"]] for i in chunk])
                logprobs.extend(logp[j, :len(data[i].tokens)] for j, i in enumerate(chunk))
            value, metrics = loss(data, logprobs)
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise Unprocessable("the custom loss must return a scalar tensor", param="loss_fn")
            value.backward()
            self.meter.train += sum(len(d.tokens) for d in data)
            return ForwardResult([{"logprobs": lp.detach().cpu().tolist()} for lp in logprobs],
                                 {"loss:sum": float(value.detach()), **{k: float(v) for k, v in metrics.items()}})

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step with ``adam``'s hyperparameters; the gradients are cleared after it."""
        with self._lock:
            self._check_open()
            if adam.learning_rate < 0 or not 0 <= adam.beta1 < 1 or not 0 <= adam.beta2 < 1 or adam.eps < 0:
                raise Unprocessable("adam_params: learning_rate and eps must be ≥ 0, beta1 and beta2 in [0, 1)",
                                    param="adam_params")
            for group in self.optimizer.param_groups:
                group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                             weight_decay=adam.weight_decay)
            clip = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1
            return {"grad_norm:mean": grad_norm, "learning_rate:mean": adam.learning_rate,
                    "optim_step:max": float(self.steps)}

    # -- sampling ---------------------------------------------------------------------------------

    def sample(self, prompt_tokens: list[int], num_samples: int, params: SamplingParams) -> list[SampledSequence]:
        """``num_samples`` continuations of ``prompt_tokens`` from the current weights."""
        with self._lock:
            self._check_open()
            out = self._m.sample(prompt_tokens, num_samples, params, self._generator)
            self.meter.prefill += len(prompt_tokens) * num_samples
            self.meter.sampled += sum(len(s.tokens) for s in out)
            return out

    @staticmethod
    def load_sampler(base_path: Path, adapter_dir: Path, device: str = "cpu", seed: int | None = None) -> LoopSampler:
        return LoopSampler(base_path, adapter_dir, device, seed)

    # -- weights and state ------------------------------------------------------------------------

    def save_weights_for_sampler(self, directory: Path) -> None:
        """The adapter as a PEFT directory, servable by the gym's inference."""
        with self._lock:
            self._check_open()
            Path(directory).mkdir(parents=True, exist_ok=True)
            # Only LoRA weights train; the base's (tied) embedding and head never change, so they
            # are not copied into the adapter (peft would when ``lm_head`` is a target).
            self._m.model.save_pretrained(str(directory), save_embedding_layers=False)

    def save_state(self, directory: Path) -> None:
        """The adapter plus AdamW's state, the RNGs and the counters (``STATE_FILE``)."""
        with self._lock:
            self.save_weights_for_sampler(directory)
            torch.save({"optimizer": self.optimizer.state_dict(), "sample_rng": self._generator.get_state(),
                        "steps": self.steps, "meter": asdict(self.meter), "seed": self.seed},
                       Path(directory) / STATE_FILE)

    def load_state(self, directory: Path, *, with_optimizer: bool = True) -> None:
        """The weights saved in ``directory``; with ``with_optimizer`` also AdamW's state, the
        sampling RNG and the step count (else the optimizer starts fresh). The adapter must have this session's rank and
        target modules. Pending gradients are dropped."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        with self._lock:
            self._check_open()
            directory = Path(directory)
            config_path, weights_path = directory / "adapter_config.json", directory / "adapter_model.safetensors"
            if not config_path.is_file() or not weights_path.is_file():
                raise NotFound(f"no saved adapter at {directory}")
            saved = json.loads(config_path.read_text())
            if saved.get("r") != self.rank or sorted(saved.get("target_modules") or []) != self.target_modules:
                raise Conflict(f"the saved adapter (rank {saved.get('r')}, modules {saved.get('target_modules')}) "
                               f"does not fit this session (rank {self.rank}, modules {self.target_modules})",
                               param="path")
            state = None
            if with_optimizer:
                if not (directory / STATE_FILE).is_file():
                    raise NotFound(f"{directory} has weights only (save_weights_for_sampler), no optimizer state")
                state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True)
            result: Any = set_peft_model_state_dict(self._m.model, load_file(str(weights_path), device=self._m.device))
            if result.unexpected_keys:
                raise Conflict(f"the saved adapter has weights this session lacks: {result.unexpected_keys[:3]}",
                               param="path")
            self.optimizer.zero_grad(set_to_none=True)
            if state is None:
                self.optimizer = self._new_optimizer()
                return
            self.optimizer.load_state_dict(state["optimizer"])
            self._generator.set_state(state["sample_rng"])
            self.steps = int(state["steps"])

    # -- bookkeeping ------------------------------------------------------------------------------

    def tokens_seen(self) -> int:
        """Tokens processed so far, all kinds together (``meter`` has them by kind)."""
        return self.meter.total()

    def close(self) -> None:
        with self._lock:
            self._m.model = None
            self.params = []

    # -- internals --------------------------------------------------------------------------------

    def _new_optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.params, lr=0.0)

    def _check_open(self) -> None:
        if self._m.model is None:
            raise Conflict("this training client is closed")

    def _chunks(self, data: list[Datum]) -> list[list[int]]:
        """Indices of ``data`` in consecutive batches of at most ``max_batch_tokens`` padded tokens."""
        chunks: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i, datum in enumerate(data):
            n = len(datum.tokens)
            if current and max(longest, n) * (len(current) + 1) > self.max_batch_tokens:
                chunks.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        if current:
            chunks.append(current)
        return chunks

    def _pad(self, rows: Sequence[Sequence[float]], width: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype, device=self._m.device)

    def _logprobs(self, tokens: list[list[int]], targets: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(target) per position [B, T] (0 where padded) and the mask of real positions."""
        width = max(len(t) for t in tokens)
        input_ids = self._pad(tokens, width, self._m.pad_id, torch.long)
        mask = self._pad([[1] * len(t) for t in tokens], width, 0, torch.long)
        target_ids = self._pad(targets, width, 0, torch.long)
        logits = self._m.model(input_ids=input_ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
        return logp * mask, mask.to(logp.dtype)

    def _run(self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None, *,
             backward: bool) -> ForwardResult:
        self._check_open()
        spec, inputs = check_data(loss_fn, data, self._m.vocab_size, self._m.max_positions)
        config = resolve_config(loss_fn, spec, loss_fn_config)
        outputs: list[dict[str, list[float]]] = [{} for _ in data]
        total = 0.0
        for chunk in self._chunks(data):
            with torch.set_grad_enabled(backward):
                width = max(len(data[i].tokens) for i in chunk)
                logp, mask = self._logprobs([data[i].tokens for i in chunk],
                                            [[int(t) for t in inputs[i]["target_tokens"]] for i in chunk])
                tensors = {key: self._pad([inputs[i][key] for i in chunk], width, 0.0, torch.float32)
                           for key in inputs[chunk[0]] if key not in INT_INPUTS}
                loss = (spec.per_token(logp, tensors, config) * mask).sum()
                if backward:
                    loss.backward()
            total += float(loss.detach())
            for j, i in enumerate(chunk):
                outputs[i] = {"logprobs": logp[j, :len(data[i].tokens)].detach().cpu().tolist()}
        return ForwardResult(outputs, {"loss:sum": total})
