"""What training and inference share of the Tinker client: the request types, the checkpoint
manifest and the service client (training trains on Tinker, inference samples from what it
trained), kept here so that neither service imports the other's backend.

The client boundary is duck-typed: a client is a ``tinker.ServiceClient`` or anything shaped
like one (``tests/fakes/fake_tinker.py``). The request types come from ``tinker.types`` when
the package is installed, else from the minimal local definitions below.

A Tinker checkpoint is a small directory holding ``tinker.json`` with its ``tinker://…``
sampler path (servable) and ``save_state`` path (to continue from), so the checkpoint
registry's weights hashes and provenance work unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

MANIFEST = "tinker.json"
MANIFEST_FORMAT = "rsigym.tinker/1"
TINKER_KEY_ENV = "TINKER_API_KEY"


# -- request types (tinker.types when installed) ----------------------------------------------


@dataclass
class EncodedTextChunk:
    tokens: list[int]
    type: str = "encoded_text"

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class ModelInput:
    chunks: list[EncodedTextChunk]

    @classmethod
    def from_ints(cls, tokens: list[int]) -> ModelInput:
        return cls(chunks=[EncodedTextChunk(tokens=list(tokens))])

    def to_ints(self) -> list[int]:
        return [t for chunk in self.chunks for t in chunk.tokens]

    @property
    def length(self) -> int:
        return sum(chunk.length for chunk in self.chunks)


@dataclass
class TensorData:
    data: list[Any]
    dtype: str  # int64 | float32
    shape: list[int] | None = None

    def tolist(self) -> list[Any]:
        return list(self.data)

    def to_torch(self) -> Any:
        import torch

        tensor = torch.tensor(self.data, dtype=torch.int64 if self.dtype == "int64" else torch.float32)
        return tensor.reshape(self.shape) if self.shape is not None else tensor


@dataclass
class Datum:
    model_input: ModelInput
    loss_fn_inputs: dict[str, TensorData]


@dataclass
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12


@dataclass
class SamplingParams:
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


@dataclass
class _LocalTypes:
    EncodedTextChunk: type = EncodedTextChunk
    ModelInput: type = ModelInput
    TensorData: type = TensorData
    Datum: type = Datum
    AdamParams: type = AdamParams
    SamplingParams: type = SamplingParams


@lru_cache(maxsize=1)
def tinker_types() -> Any:
    """``tinker.types`` when the SDK is installed, else the local stand-ins (same names and fields)."""
    try:
        from tinker import types

        return types
    except ImportError:
        return _LocalTypes()


# -- checkpoints --------------------------------------------------------------------------


@dataclass
class TinkerWeights:
    """What the checkpoint registry stores for a Tinker checkpoint: ``save_pretrained`` writes tinker.json."""

    manifest: dict[str, Any] = field(default_factory=dict)

    def save_pretrained(self, save_directory: str | Path, **_: Any) -> None:
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST).write_text(json.dumps(self.manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def tinker_manifest(checkpoint_dir: str | Path | None) -> dict[str, Any] | None:
    """The tinker.json of a checkpoint directory, or None when it is not a Tinker checkpoint."""
    if not checkpoint_dir:
        return None
    path = Path(checkpoint_dir) / MANIFEST
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not str(data.get("path", "")).startswith("tinker://"):
        raise ValueError(f"{path} is not a Tinker checkpoint manifest")
    return data


# -- the client ---------------------------------------------------------------------------


def service_client(secrets: Any) -> Any:
    """The real Tinker client: the ``cloud`` extra and the platform's own TINKER_API_KEY
    (never the agent's; it stays in the platform's environment)."""
    try:
        import tinker
    except ImportError as err:
        from kit.errors import ServiceUnavailable

        raise ServiceUnavailable("tinker base models need the cloud extra: pip install 'rsigym[cloud]'") from err
    return tinker.ServiceClient(api_key=secrets.get(TINKER_KEY_ENV))
