"""A fake of the remote Tinker service, at the ``tinker.ServiceClient`` boundary.

Underneath it really trains: a LoRA (peft) on the project's tiny model on CPU, with the
gradients of Tinker's ``cross_entropy`` loss (``-(weights * logp(target_tokens)).sum()``) and
Adam steps at the learning rate each ``optim_step`` names. ``save_weights_for_sampler`` /
``save_state`` write the adapter to a private directory and hand back a ``tinker://`` path;
only this fake's sampling clients can resolve it, exactly as only Tinker can resolve its own.
Sampling returns token ids (the end-of-turn token included, as Tinker does), never text.

It reads requests duck-typed (``tinker.types`` or the gym's stand-ins), returns futures with
``.result()``, and records every call in ``calls`` for assertions. ``fail_next(method, exc)``
makes the next call of a method raise, as a network or service failure would.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class FakeFuture:
    def __init__(self, value: Any = None, error: BaseException | None = None):
        self._value, self._error = value, error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class TinkerAPIError(Exception):
    """What the fake raises for a request the real service would refuse."""


class FakeTinkerConnectionError(ConnectionError):
    """A network failure between the gym and the service."""


def _ints(value: Any) -> list[int]:
    if hasattr(value, "to_ints"):
        return list(value.to_ints())
    if hasattr(value, "tolist"):
        return [int(x) for x in value.tolist()]
    if hasattr(value, "data"):
        return [int(x) for x in value.data]
    return [int(x) for x in value]


def _floats(value: Any) -> list[float]:
    if hasattr(value, "tolist"):
        return [float(x) for x in value.tolist()]
    if hasattr(value, "data"):
        return [float(x) for x in value.data]
    return [float(x) for x in value]


class FakeServiceClient:
    """``tinker.ServiceClient`` for one base model (``base_model``), backed by ``model_dir``."""

    def __init__(self, model_dir: Path | str, storage: Path | str, base_model: str = "fake/tiny-qwen3"):
        self.model_dir = str(model_dir)
        self.storage = Path(storage)
        self.base_model = base_model
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._paths: dict[str, Path] = {}
        self._failures: dict[str, BaseException] = {}
        self._ids = itertools.count(1)
        self.lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------------------------------

    def record(self, method: str, **details: Any) -> None:
        with self.lock:
            self.calls.append((method, details))
            error = self._failures.pop(method, None)
        if error is not None:
            raise error

    def fail_next(self, method: str, error: BaseException) -> None:
        with self.lock:
            self._failures[method] = error

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def register(self, path: str, directory: Path) -> None:
        with self.lock:
            self._paths[path] = directory

    def resolve(self, path: str) -> Path:
        with self.lock:
            if path not in self._paths:
                raise TinkerAPIError(f"404: no weights at {path}")
            return self._paths[path]

    def local_dir(self, path: str) -> Path:
        """For tests: where the fake keeps the weights behind a ``tinker://`` path."""
        return self.resolve(path)

    def _check_base(self, base_model: str) -> None:
        if base_model != self.base_model:
            raise TinkerAPIError(f"400: base model {base_model!r} is not supported (this service has {self.base_model!r})")

    # -- the ServiceClient surface -------------------------------------------------------------

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None) -> FakeTrainingClient:
        self.record("create_lora_training_client", base_model=base_model, rank=rank, seed=seed, train_mlp=train_mlp,
                    train_attn=train_attn, train_unembed=train_unembed)
        self._check_base(base_model)
        return FakeTrainingClient(self, f"fake-model-{next(self._ids)}", rank, seed, train_mlp, train_attn)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any = None) -> FakeSamplingClient:
        self.record("create_sampling_client", model_path=model_path, base_model=base_model)
        if (model_path is None) == (base_model is None):
            raise TinkerAPIError("400: give exactly one of model_path or base_model")
        if base_model is not None:
            self._check_base(base_model)
            return FakeSamplingClient(self, None, base_model)
        return FakeSamplingClient(self, self.resolve(model_path), model_path)


class FakeTrainingClient:
    def __init__(self, service: FakeServiceClient, model_id: str, rank: int, seed: int | None, train_mlp: bool,
                 train_attn: bool):
        import torch
        from peft import LoraConfig, get_peft_model

        from services.models.loading import load_model

        self.service, self.model_id, self.rank = service, model_id, rank
        targets = (["q_proj", "k_proj", "v_proj", "o_proj"] if train_attn else []) + \
                  (["gate_proj", "up_proj", "down_proj"] if train_mlp else [])
        if not targets:
            raise TinkerAPIError("400: nothing to train")
        if seed is not None:
            torch.manual_seed(seed)
        self.model = get_peft_model(load_model(service.model_dir, "cpu"),
                                    LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, task_type="CAUSAL_LM"))
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: Any = None
        self.lock = threading.Lock()

    def forward_backward(self, data: list[Any], loss_fn: str = "cross_entropy") -> FakeFuture:
        import torch

        self.service.record("forward_backward", model_id=self.model_id, n=len(data), loss_fn=loss_fn)
        if loss_fn != "cross_entropy":
            return FakeFuture(error=TinkerAPIError(f"400: loss_fn {loss_fn!r} is not supported by this fake"))
        inputs = [_ints(d.model_input) for d in data]
        targets = [_ints(d.loss_fn_inputs["target_tokens"]) for d in data]
        weights = [_floats(d.loss_fn_inputs["weights"]) for d in data]
        if any(len(i) != len(t) or len(t) != len(w) for i, t, w in zip(inputs, targets, weights, strict=True)):
            return FakeFuture(error=TinkerAPIError("400: model_input, target_tokens and weights differ in length"))
        width = max(len(i) for i in inputs)
        ids = torch.zeros((len(data), width), dtype=torch.long)
        tgt = torch.zeros((len(data), width), dtype=torch.long)
        wts = torch.zeros((len(data), width))
        mask = torch.zeros((len(data), width), dtype=torch.long)
        for row, (i, t, w) in enumerate(zip(inputs, targets, weights, strict=True)):
            ids[row, : len(i)] = torch.tensor(i)
            tgt[row, : len(t)] = torch.tensor(t)
            wts[row, : len(w)] = torch.tensor(w)
            mask[row, : len(i)] = 1
        with self.lock:
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            loss = -(logprobs * wts).sum()
            loss.backward()
        outputs = [{"logprobs": logprobs[row, : len(i)].detach().tolist()} for row, i in enumerate(inputs)]
        return FakeFuture(SimpleNamespace(loss_fn_output_type="cross_entropy", loss_fn_outputs=outputs,
                                          metrics={"loss:sum": float(loss.detach())}))

    def optim_step(self, adam_params: Any) -> FakeFuture:
        import torch

        lr = float(adam_params.learning_rate)
        self.service.record("optim_step", model_id=self.model_id, learning_rate=lr)
        with self.lock:
            betas = (float(adam_params.beta1), float(adam_params.beta2))
            if self.optimizer is None:
                self.optimizer = torch.optim.Adam(self.params, lr=lr, betas=betas, eps=float(adam_params.eps))
            for group in self.optimizer.param_groups:
                group["lr"], group["betas"], group["eps"] = lr, betas, float(adam_params.eps)
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, float("inf")))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return FakeFuture(SimpleNamespace(metrics={"optim/grad_norm": norm}))

    def _save(self, kind: str, name: str) -> FakeFuture:
        path = f"tinker://{self.model_id}/{kind}/{name}"
        directory = self.service.storage / self.model_id / kind / name
        with self.lock:
            self.model.save_pretrained(directory)
        self.service.register(path, directory)
        return FakeFuture(SimpleNamespace(path=path, type=f"save_{kind}"))

    def save_weights_for_sampler(self, name: str) -> FakeFuture:
        self.service.record("save_weights_for_sampler", model_id=self.model_id, name=name)
        return self._save("sampler_weights", name)

    def save_state(self, name: str) -> FakeFuture:
        self.service.record("save_state", model_id=self.model_id, name=name)
        return self._save("weights", name)

    def load_state(self, path: str) -> FakeFuture:
        """Weights only (``load_state_with_optimizer`` would also restore Adam's moments)."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        self.service.record("load_state", model_id=self.model_id, path=path)
        directory = self.service.resolve(path)
        with self.lock:
            set_peft_model_state_dict(self.model, load_peft_weights(str(directory)))
        return FakeFuture(SimpleNamespace(path=path, type="load_weights"))


class FakeSamplingClient:
    def __init__(self, service: FakeServiceClient, adapter_dir: Path | None, name: str):
        from services.models.loading import load_model, load_tokenizer

        self.service, self.name = service, name
        model = load_model(service.model_dir, "cpu")
        if adapter_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_dir))
        self.model = model.eval()
        self.tokenizer = load_tokenizer(service.model_dir)
        eos = model.config.eos_token_id
        self.end_ids = {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
        self.lock = threading.Lock()

    def sample(self, prompt: Any, num_samples: int, sampling_params: Any, include_prompt_logprobs: bool = False) -> FakeFuture:
        import torch

        self.service.record("sample", model=self.name, num_samples=num_samples,
                            max_tokens=sampling_params.max_tokens, temperature=sampling_params.temperature)
        ids = _ints(prompt)
        stop = sampling_params.stop
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        stop_ids = {int(s) for s in (stop or []) if isinstance(s, int)} if not isinstance(stop, str) else set()
        generator = torch.Generator()
        sequences = []
        with self.lock, torch.no_grad():
            for n in range(num_samples):
                if sampling_params.seed is not None:
                    generator.manual_seed(int(sampling_params.seed) + n)
                else:
                    generator.seed()
                out: list[int] = []
                reason = "length"
                past, step_input = None, torch.tensor([ids])
                for _ in range(int(sampling_params.max_tokens or 16)):
                    result = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                    past = result.past_key_values
                    logits = result.logits[0, -1].float()
                    if sampling_params.temperature <= 0:
                        token = int(torch.argmax(logits))
                    else:
                        probs = torch.softmax(logits / sampling_params.temperature, dim=-1)
                        token = int(torch.multinomial(probs, 1, generator=generator))
                    out.append(token)
                    if token in self.end_ids or token in stop_ids:
                        reason = "stop"
                        break
                    if stops and any(s in self.tokenizer.decode(out, skip_special_tokens=False) for s in stops):
                        reason = "stop"
                        break
                    step_input = torch.tensor([[token]])
                sequences.append(SimpleNamespace(tokens=out, stop_reason=reason, logprobs=None))
        return FakeFuture(SimpleNamespace(sequences=sequences, type="sample", prompt_logprobs=None))
