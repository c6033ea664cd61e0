"""What others may ask the inference service without calling it: whether a ``gym:`` agent model
(services/inference/agent_models.py) may be served to a new run — asked when the run key is
minted (gateway/admin.py), so a run started with a model it could never use is refused before
its agent starts, not on its first call. Light: the logic is imported when asked."""

from __future__ import annotations

from typing import Any

from kit.config import GYM_AGENT_PREFIX


def check_new_run_agent_model(context: Any, name: str | None) -> None:
    """Raise the refusal (404 unknown, 403 not eligible) for ``gym:<model>`` that no new run may
    use; catalogue names and None pass (the agent route checks them on every call)."""
    if name is None or not name.startswith(GYM_AGENT_PREFIX):
        return
    from services.inference.agent_models import servable
    from services.training.checkpoints import CheckpointRegistry

    servable(context.config, CheckpointRegistry.of(context), "", name)  # "": a run with nothing of its own yet
