"""Which of the gym's own models a run's research agent may use as its model (the agent route,
services/inference/agent.py), and the isolation that comes with it.

A gym-served agent model is one of:

* a catalogue entry ``served_by = "gym"`` (``agent_models`` in the config): a base model, for
  every run, like any catalogue agent model;
* ``gym:<base model>``, ``gym:<checkpoint id>`` or ``gym:from:<run>``: the one model a run was
  started with (``rsigym run start --agent-model``, kept on its run key as ``agent_model``). The
  agent route serves a run that model and the catalogue, nothing else: a run cannot switch to
  another gym model mid-run by naming it.

A checkpoint served as an agent model is *immutable and someone else's*: it is the final,
scored, audit-accepted submission of a run that has ended (``gym:from:<run>`` names that
run). A checkpoint id names one version forever (services/training/checkpoints.py), the run that
wrote it can write no more, and the run that uses it gets no inference or training grant to it
through this path (services/inference/service.py's ``resolve_model`` still knows only the
caller's own checkpoints). A run's own checkpoints are refused: its agent's weights are not the
run's to change mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from access.generations import initial_system
from kit.config import GYM_AGENT_PREFIX, BaseModel_, GymConfig
from kit.errors import Conflict, NotFound, PermissionDenied
from services.inference.backends.base import Adapter
from services.records.read import accepted_system
from services.training.checkpoints import CheckpointRegistry
from storage.store import Store
from storage.tables import ApiKey

FROM_RUN = "from:"
"""``gym:from:<run>``: that run's accepted, scored final submission."""


@dataclass(frozen=True)
class GymAgentModel:
    name: str
    base: BaseModel_
    adapter: Adapter | None = None
    source_run: str | None = None
    """The ended run whose submission this is (None: a base model)."""


def run_agent_model(store: Store, run_id: str) -> str | None:
    """The agent model run ``run_id`` was started with (its run key's ``agent_model``)."""
    with store.transaction() as s:
        run = s.get(ApiKey, run_id)
        return run.agent_model if run is not None else None


def is_gym_served(config: GymConfig, name: object) -> bool:
    """Whether the agent route's ``model`` names one of the gym's own models (a ``gym:`` name or a
    ``served_by = "gym"`` catalogue entry): the inference service answers it, not the rollout service."""
    return isinstance(name, str) and (name.startswith(GYM_AGENT_PREFIX) or config.gym_agent_model(name) is not None)


def accepted_submission(store: Store, run_id: str) -> tuple[str | None, str]:
    """(checkpoint id or None, model) of run ``run_id``'s final submission, when the run has ended
    and that submission is scored and accepted by its newest audit — the same rule as ``--from``
    (access/generations.py, services/records/read.py accepted_system); else 404 for no such run,
    403 saying what is missing."""
    with store.transaction() as s:
        try:
            system = initial_system(s, run_id, accepted_system)
        except NotFound:
            raise NotFound(f"no run {run_id!r}", param="model") from None
        except Conflict as err:
            raise PermissionDenied("only an ended run's scored, audit-accepted final submission can be an agent "
                                   f"model (its weights must not change): {err.message}", param="model") from None
        return (system.model if system.is_checkpoint else None), system.model


def _checkpoint(config: GymConfig, checkpoints: CheckpointRegistry, name: str, ckpt_id: str) -> GymAgentModel:
    ckpt = checkpoints.find(ckpt_id)
    if ckpt is None:
        raise NotFound(f"no checkpoint {ckpt_id!r}", param="model")
    base = config.base_model(ckpt.base_model)
    if base is None:
        raise NotFound(f"the base model of {ckpt_id} is no longer offered", param="model")
    return GymAgentModel(name=name, base=base, adapter=Adapter(key=ckpt.id, path=ckpt.path), source_run=ckpt.run_id)


def servable(config: GymConfig, checkpoints: CheckpointRegistry, run_id: str, name: str) -> GymAgentModel:
    """What ``gym:<target>`` serves run ``run_id`` — a base model, or an ended run's accepted and
    scored final submission (never ``run_id``'s own) — or the refusal (404 unknown, 403 not eligible).
    Used when a run is started with it and on every call."""
    target = name.removeprefix(GYM_AGENT_PREFIX)
    base = config.base_model(target)
    if base is not None:
        return GymAgentModel(name=name, base=base)
    store = checkpoints.store
    if target.startswith(FROM_RUN):
        source = target.removeprefix(FROM_RUN)
        if source == run_id:
            raise PermissionDenied("a run's own submission cannot be its agent model", param="model")
        ckpt_id, model = accepted_submission(store, source)
        if ckpt_id is None:  # a submission that kept its base model (the harness track)
            kept = config.base_model(model)
            if kept is None:
                raise NotFound(f"the base model of run {source}'s submission is no longer offered", param="model")
            return GymAgentModel(name=name, base=kept, source_run=source)
        return _checkpoint(config, checkpoints, name, ckpt_id)
    ckpt = checkpoints.find(target)
    if ckpt is None:
        raise NotFound(f"no base model or checkpoint {target!r}", param="model")
    if ckpt.run_id == run_id:
        raise PermissionDenied("a run's own checkpoint cannot be its agent model: the agent's weights are not the "
                               "run's to change", param="model")
    ckpt_of_submission, _ = accepted_submission(store, ckpt.run_id)
    if ckpt_of_submission != ckpt.id:
        raise PermissionDenied(f"checkpoint {target} is not its run's final submission", param="model")
    return _checkpoint(config, checkpoints, name, ckpt.id)


def resolve_agent_model(config: GymConfig, checkpoints: CheckpointRegistry, run_id: str, name: object) -> GymAgentModel:
    """The gym model the agent route serves run ``run_id`` under ``name``: a gym-served catalogue
    entry, or the ``gym:`` model the run was started with — any other ``gym:`` name is refused."""
    if not isinstance(name, str):
        raise NotFound("model must be a model name", param="model")
    entry = config.gym_agent_model(name)
    if entry is not None:
        base = config.base_model(entry.gym_model or "")
        if base is None:
            raise NotFound(f"the base model of {name} is no longer offered", param="model")
        return GymAgentModel(name=name, base=base)
    if not name.startswith(GYM_AGENT_PREFIX):
        raise NotFound(f"model {name!r} is not one of the gym's own agent models", param="model")
    if run_agent_model(checkpoints.store, run_id) != name:
        raise PermissionDenied(f"model {name!r} is not this run's agent model: the agent route serves a run the "
                               "gym model it was started with (rsigym run start --agent-model) and the configured "
                               "agent models", param="model")
    return servable(config, checkpoints, run_id, name)
