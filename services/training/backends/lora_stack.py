"""Stacking a new LoRA on a parent adapter trained with other settings, saved as ONE adapter.

A job whose ``lora`` (rank, alpha, targets) differs from its parent checkpoint's adapter cannot
continue that adapter. It trains a new adapter with its own settings over a new base instead:
the base model with the parent's adapter merged into its weights (base + Δparent, frozen).

What is saved is one standard PEFT adapter that every consumer (inference, evaluation, the
Tinker loop's samplers, the provenance audit's weights hash) serves unchanged: the two adapters
concatenated along the rank. A LoRA adds ``s·B·A·x`` with ``s`` its scaling (``alpha/r``, or
``alpha/√r`` with rsLoRA), so for every targeted module

    s1·B1·A1 + s2·B2·A2 = [s1·B1 | s2·B2] · [A1 ; A2]

which is a rank ``r1 + r2`` LoRA with scaling 1 (``lora_alpha = r``). A module only one of the
two targets gets zeros in the other's block. The sum is exact (up to float rounding): the saved
adapter's outputs are those of base + Δparent + Δchild.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.training.schemas import LoraSpec
from services.training.trainer import TrainerError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_HALVES = {"lora_A": "lora_B", "lora_embedding_A": "lora_embedding_B"}
"""A's rank is its first dimension, B's its second (Linear, Embedding and Conv LoRAs alike)."""


def parent_lora(parent_dir: str) -> Any | None:
    """The parent adapter's ``LoraConfig`` (None when the directory holds no PEFT adapter)."""
    from peft import LoraConfig

    if not (Path(parent_dir) / ADAPTER_CONFIG).is_file():
        return None
    return LoraConfig.from_pretrained(parent_dir)


def same_settings(parent: Any, lora: LoraSpec) -> bool:
    """Whether the job's LoRA is the parent adapter's: then the job continues it (dropout aside)."""
    targets = parent.target_modules
    return (parent.r == lora.rank and float(parent.lora_alpha) == float(lora.alpha)
            and not isinstance(targets, str) and sorted(targets or []) == sorted(lora.target_modules))


def lora_view(config: Any) -> dict[str, Any]:
    return {"rank": int(config.r), "alpha": float(config.lora_alpha), "rslora": bool(config.use_rslora),
            "target_modules": sorted(config.target_modules)}


def scaling(config: Any) -> float:
    r = int(config.r)
    return float(config.lora_alpha) / (r ** 0.5 if config.use_rslora else r)


def require_stackable(config: Any, who: str) -> None:
    """Only plain LoRAs concatenate into one: no DoRA, no per-module ranks, no fully trained modules."""
    why = ("its target_modules is a pattern" if isinstance(config.target_modules, str)
           else "it is a DoRA" if config.use_dora
           else "it has per-module ranks or alphas" if (config.rank_pattern or config.alpha_pattern)
           else "it trains whole modules (modules_to_save)" if config.modules_to_save
           else "it trains biases" if getattr(config, "lora_bias", False)
           else None)
    if why is not None:
        raise TrainerError(f"cannot stack a new LoRA on the {who} adapter: {why}")


def stacked_config(parent: Any, child: Any) -> Any:
    """The concatenated adapter's config: rank r1 + r2, scaling 1, the union of the targets."""
    from peft import LoraConfig

    rank = int(parent.r) + int(child.r)
    alpha: Any = rank  # peft annotates an int; scaling = alpha / r = 1
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=child.lora_dropout,
                      target_modules=sorted(set(parent.target_modules) | set(child.target_modules)),
                      base_model_name_or_path=parent.base_model_name_or_path, task_type="CAUSAL_LM")


def concatenate(parent: dict[str, Any], parent_scale: float, parent_rank: int,
                child: dict[str, Any], child_scale: float, child_rank: int) -> dict[str, Any]:
    """The concatenated state dict (PEFT's saved key names, ``…q_proj.lora_A.weight``): for each
    module either adapter targets, A = [A1; A2] and B = [s1·B1 | s2·B2], zero blocks where one of
    the two lacks the module. Computed in float32, saved in the child's dtype."""
    import torch

    out: dict[str, Any] = {}
    pairs = _pairs(parent, "parent") | _pairs(child, "new")
    for a_key, b_key in sorted(pairs):
        a1, b1, a2, b2 = parent.get(a_key), parent.get(b_key), child.get(a_key), child.get(b_key)
        if (a1 is None) != (b1 is None) or (a2 is None) != (b2 is None):
            raise TrainerError(f"cannot stack: {a_key!r} has no {b_key!r} beside it (or the other way round)")
        a_like, b_like = (a2, b2) if a2 is not None else (a1, b1)
        assert a_like is not None and b_like is not None  # _pairs found the key in one of the two
        dtype = a_like.dtype
        if a1 is None or b1 is None:
            a1, b1 = _zeros(a_like, 0, parent_rank), _zeros(b_like, 1, parent_rank)
        if a2 is None or b2 is None:
            a2, b2 = _zeros(a_like, 0, child_rank), _zeros(b_like, 1, child_rank)
        out[a_key] = torch.cat([a1.float(), a2.float()], dim=0).to(dtype).contiguous()
        out[b_key] = torch.cat([b1.float() * parent_scale, b2.float() * child_scale], dim=1).to(dtype).contiguous()
    return out


def _pairs(state: dict[str, Any], who: str) -> set[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for key in state:
        dotted = f".{key}."
        for a, b in _HALVES.items():
            if f".{a}." in dotted:
                pairs.add((key, dotted.replace(f".{a}.", f".{b}.")[1:-1]))
                break
            if f".{b}." in dotted:
                break
        else:
            raise TrainerError(f"cannot stack: the {who} adapter holds {key!r}, not a LoRA A/B matrix")
    return pairs


def _zeros(like: Any, dim: int, rank: int) -> Any:
    import torch

    shape = list(like.shape)
    shape[dim] = rank
    return torch.zeros(shape, dtype=torch.float32)


class StackedAdapter:
    """What the trainer hands the registry at a checkpoint of a stacked job: ``save_pretrained``
    writes the concatenation of the parent adapter and the new one as one PEFT adapter."""

    def __init__(self, parent_dir: str, parent: Any, child_model: Any, child: Any, metrics: dict[str, Any]):
        self.parent_dir, self.parent, self.child_model, self.child = parent_dir, parent, child_model, child
        self.checkpoint_metrics = metrics
        """Merged into the checkpoint's metrics (services/training/trainer.py): what it stacks."""

    def save_pretrained(self, directory: str | Path) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import load_file, save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        parent_state = load_file(str(Path(self.parent_dir) / ADAPTER_WEIGHTS))
        child_state = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(self.child_model).items()}
        state = concatenate(parent_state, scaling(self.parent), int(self.parent.r),
                            child_state, scaling(self.child), int(self.child.r))
        stacked_config(self.parent, self.child).save_pretrained(str(directory))
        save_file(state, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
