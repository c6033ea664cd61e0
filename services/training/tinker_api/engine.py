"""The training-loop engine behind the Tinker API, behind a small Protocol.

The default is the local engine (services/training/loop: a LoRA model held in this process,
stepped call by call). It is imported on first use, so the service starts without it and a
test may hand :class:`~services.training.tinker_api.sessions.TinkerAPI` another engine. A base
model the operator runs on Tinker (``backend = "tinker"``) is served by the pass-through engine
(cloud_engine.py), which carries each call out on Tinker's own service. ``base`` is the base
model's config entry (the pass-through reads its ``tinker_base_model``; the local engine its path).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

from kit.config import BaseModel_


class Engine(Protocol):
    def training(self, *, base_path: Path, rank: int, seed: int, device: str, base: BaseModel_) -> Any:
        """A training session (``forward``, ``forward_backward``, ``optim_step``, ``sample``,
        ``save_weights_for_sampler``, ``save_state``, ``load_state``)."""

    def sampler(self, *, base_path: Path, adapter_dir: Path, device: str, base: BaseModel_) -> Any:
        """A sampling-only session on the base model with ``adapter_dir``'s LoRA adapter."""

    def datum(self, tokens: list[int], loss_fn_inputs: dict[str, list[Any]]) -> Any: ...

    def adam(self, params: dict[str, Any]) -> Any: ...

    def sampling_params(self, params: dict[str, Any]) -> Any: ...


def _build(cls: Any, values: dict[str, Any]) -> Any:
    """``cls`` from the ``values`` it has fields for (the wire may carry more)."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(values)
    return cls(**{k: v for k, v in values.items() if k in names and v is not None})


class LoopEngine:
    """services/training/loop: the project's own in-process LoRA training loop."""

    def training(self, *, base_path: Path, rank: int, seed: int, device: str, base: BaseModel_) -> Any:
        from services.training.loop.session import LoopSession

        return LoopSession(base_path=base_path, rank=rank, seed=seed, device=device)

    def sampler(self, *, base_path: Path, adapter_dir: Path, device: str, base: BaseModel_) -> Any:
        from services.training.loop.session import LoopSession

        return LoopSession.load_sampler(base_path, adapter_dir, device)

    def datum(self, tokens: list[int], loss_fn_inputs: dict[str, list[Any]]) -> Any:
        from services.training.loop.types import Datum

        return Datum(tokens=tokens, loss_fn_inputs=loss_fn_inputs)

    def adam(self, params: dict[str, Any]) -> Any:
        from services.training.loop.types import AdamParams

        return _build(AdamParams, params)

    def sampling_params(self, params: dict[str, Any]) -> Any:
        from services.training.loop.types import SamplingParams

        return _build(SamplingParams, params)
