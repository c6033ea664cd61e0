"""The Tinker API's state and logic: sessions, training models, sampling sessions, futures.

Where things live: a training model (a LoRA adapter being stepped) is held in the memory of
the training service process that created it, so its futures are kept there too — one process
answers for a model from ``create_model`` to its last ``retrieve_future``. The Tinker API thus
needs the training service as one replica (the embedded gym, and the compose/Helm default), or
sticky routing by model; what outlives the process is on disk and in the store: checkpoints
(the registry), saved states (``<data dir>/tinker/states``), the ledger and the records.

Sessions end when their client finishes them (the SDK's ``ServiceClient.close()``) or when they
fall silent: a session that shows no sign of life for ``RSIGYM_TINKER_SESSION_TTL_S`` (default
120 s: the SDK heartbeats every 10 s) is expired by the API's reaper thread, exactly as a finish
would end it — its training models closed after their queued calls (which settle or release their
holds), their loop data registered and their job rows finished. A sign of life is the session's
creation, a heartbeat, or any call naming the session, one of its training models or one of its
sampling sessions (``retrieve_future`` names a request, not a session, and does not count: the
SDK's heartbeat runs beside its polls). A call on an ended session or on a model its end closed
is refused with 410 ``session_ended`` saying why; the SDK's heartbeat loop stops on that 410.
Sampling sessions outlive their session's end (their weights are registered checkpoints).

Ordering: each model has one worker thread and runs its calls one at a time in the order they
arrived (the SDK sends them in ``seq_id`` order, one after the other, as Tinker guarantees);
each sampling session has its own.

Metering: a call that costs money reserves its worst case on the ledger *when it is accepted*
(so an unpaid call is refused with the gym's 402 before it is queued) and settles after the
work, or releases the hold when the work did not happen. Saved weights and states are charged
to the run's storage quota as job checkpoints are.

The audit sees the loop (loop_data.py): what ``forward_backward`` trained on and what was sampled
is written down as loop rows; each saved checkpoint or state, and the model's end, registers the
rows so far as a dataset of the run, which the checkpoint lists in its provenance
(``dataset_hashes``, inherited through a loaded state) and a ``training.job`` event of the model's
job names — so contamination in a loop is found and attributed as in an uploaded dataset. Each
training model is an experiment (implicit, continuing the one its loaded state came from).

Engines: a base model with ``backend = "local"`` is trained by the local loop (engine.py); one the
operator runs on Tinker (``backend = "tinker"``) is passed through to Tinker's own service
(cloud_engine.py) with the platform's key — metered, governed, recorded and registered here all
the same, the upstream's paths kept behind the gym's own.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import update

from access.policy import ServicePolicy
from billing.ledger import Ledger
from billing.money import token_cost_nusd
from billing.storage_quota import StorageQuota, tree_bytes
from kit.config import BaseModel_
from kit.errors import GymError, NotFound, PermissionDenied, Unprocessable
from kit.identity import Identity
from kit.ids import new_id
from kit.private_files import lock_down, private_dir
from kit.spec import ServiceContext
from services.records.events import TRAINING_JOB, EventLog
from services.records.experiments import ExperimentRegistry
from services.training.checkpoints import CheckpointRegistry, hash_dir
from services.training.datasets import DatasetStore
from services.training.tables import TrainingJob
from services.training.tinker_api import protowire
from services.training.tinker_api.engine import Engine, LoopEngine
from services.training.tinker_api.loop_data import LoopData

log = logging.getLogger("rsigym.training.tinker")

ENGINE_BACKENDS = frozenset({"local", "tinker"})
"""The base model backends the Tinker API trains on: the local loop, or passed through to Tinker."""

TINKER_PREFIX = "tinker://"
LOSS_FNS = frozenset({"cross_entropy", "importance_sampling", "ppo", "cispo"})
"""The engine's losses (services/training/loop/losses.py, which imports torch: named here so the wire
layer refuses another with a 422 before any work is queued)."""
INTERACTIVE = "interactive"
"""The status of a Tinker training model's job row while it is open (neither queued for a worker
nor final); ``succeeded`` once its session ends."""
MAX_FINISHED_FUTURES = 4096
FINISH_WAIT_S = 120.0
"""How long finishing a session waits for its models' last calls and loop-data registration."""
REAP_INTERVAL_MAX_S = 10.0
"""The reaper looks for silent sessions every quarter of the TTL, at most this far apart."""
ENDED_SESSIONS_KEPT_S = 3600.0
"""How long an ended session is remembered, so that a late call on it is told why it is refused."""


class SessionEnded(GymError):
    """A call naming a Tinker session that has ended — finished by its client, or expired when its
    heartbeats stopped — or a training model its end closed. 410: gone for good, and what the
    SDK's heartbeat loop reads as "this session has finished"."""

    status, type = 410, "session_ended"


@dataclass
class Outcome:
    """A future's result: JSON, protobuf bytes, or the gym error it failed with."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: GymError | None = None


@dataclass
class _Session:
    run_id: str
    beat: float
    """``time.monotonic()`` of its last sign of life (its creation, a heartbeat, a call naming it)."""
    ended: str | None = None
    """None while open; ``"finished"`` (its client's ``close()``) or ``"expired"`` (silent past the TTL)."""
    ended_at: float = 0.0
    closed: list[str] = field(default_factory=list)
    """The training models (ids and SDK aliases) its end closed."""


@dataclass
class _Future:
    run_id: str
    done: concurrent.futures.Future[Outcome]


@dataclass
class _Model:
    id: str
    run_id: str
    key_id: str
    session_id: str
    base: BaseModel_
    rank: int
    seed: int
    engine_session: Any
    worker: concurrent.futures.ThreadPoolExecutor
    parent: str | None = None
    """The registered checkpoint or saved state it was loaded from (a tinker:// path)."""
    experiment_id: str | None = None
    datasets: list[dict[str, str]] = field(default_factory=list)
    """``{"id", "sha256"}`` of the loop-data datasets its weights carry: those of the state it
    loaded, then its own registered segments (loop_data.py)."""
    loss_fns: set[str] = field(default_factory=set)
    optim_steps: int = 0
    adam: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Sampler:
    id: str
    run_id: str
    base: BaseModel_
    model_path: str | None
    adapter_dir: Path
    worker: concurrent.futures.ThreadPoolExecutor
    owner: str
    """The training model (its job id) whose weights it samples: its loop data takes the samples."""
    session_id: str | None = None
    engine_session: Any = None
    ephemeral: bool = False


def _log_close_failure(done: concurrent.futures.Future[None]) -> None:
    err = done.exception()
    if err is not None:
        log.error("closing a training model of an expired Tinker session failed", exc_info=err)


def _fail(err: BaseException) -> GymError:
    return err if isinstance(err, GymError) else GymError(f"the call failed: {type(err).__name__}: {err}")


def check_fields(policies: list[ServicePolicy], values: dict[str, Any], *, model: str | None = None) -> dict[str, Any]:
    """The key's training rules applied to the values a Tinker call carries, named by the
    training job's field paths (``base_model``, ``lora.rank``, ``seed``, ``learning_rate``,
    ``loss``, ``parent_checkpoint``): 403 ``permission_denied`` naming the field, as the gateway
    answers a job request. A value left out (None) takes a ``fixed`` rule's value. Returns the
    values as they will run."""
    out = dict(values)
    for policy in policies:
        for path, rule in policy.fields.items():
            if path not in out:
                continue
            if out[path] is None and rule.kind == "fixed":
                out[path] = rule.arg
            if out[path] is not None and not rule.admits(out[path]):
                raise PermissionDenied(
                    f"training field {path} = {json.dumps(out[path], default=str)} is refused by this key's policy "
                    f"({rule.describe()})", param=path)
            if out[path] is None and rule.kind == "fixed" and rule.arg is not None:
                raise PermissionDenied(f"training field {path} is fixed by this key's policy ({rule.describe()})",
                                       param=path)
        if model is not None and not policy.allows_model(model):
            raise PermissionDenied(f"model {model!r} is not in this key's training model allowlist", param="base_model")
    return out


class TinkerAPI:
    def __init__(self, context: ServiceContext, registry: CheckpointRegistry, events: EventLog,
                 engine: Engine | None = None, device: str | None = None, models_dir: Path | None = None,
                 datasets: DatasetStore | None = None, cloud: Engine | None = None,
                 session_ttl_s: float | None = None):
        self.context = context
        self.config = context.config
        self.store = context.store
        self.registry = registry
        self.events = events
        self.engine: Engine = engine or LoopEngine()
        self._cloud = cloud
        """The pass-through engine for base models on Tinker (made on first use: cloud_engine.py)."""
        self.ledger = Ledger(context.store, context.config.ledger)
        self.quota = StorageQuota.of(context)
        self.models_dir = models_dir or context.settings.resolved_models_dir()
        self.states_dir = context.data_dir / "tinker" / "states"
        self.scratch_dir = context.data_dir / "tinker" / "scratch"
        self.datasets = datasets or DatasetStore(
            context.store, context.data_dir / "datasets", context.config.training.max_dataset_bytes,
            context.config.training.max_dataset_rows, events=events)
        self.loop = LoopData(context.data_dir / "tinker" / "loop", self.datasets)
        self.experiments = ExperimentRegistry(events)
        self._device = device
        self._lock = threading.Lock()
        self.session_ttl_s = float(context.settings.tinker_session_ttl_s if session_ttl_s is None else session_ttl_s)
        """A session silent for longer is expired (``RSIGYM_TINKER_SESSION_TTL_S``; 0: never)."""
        self._sessions: dict[str, _Session] = {}
        self._gone: dict[str, str] = {}
        """Training model id or alias → the ended session that closed it (while that is remembered)."""
        self._reaper: tuple[threading.Thread, threading.Event] | None = None
        """The reaper thread and what stops it: started with a session, stopped by :meth:`shutdown`
        (and started again by a later session: an app's lifespan may end and begin again)."""
        self._models: dict[str, _Model] = {}
        self._aliases: dict[str, str] = {}
        """``<session id>:train:<model seq id>`` → model id: the id the SDK derives itself for a
        model it creates by loading weights (``create_training_client_from_state``), as Tinker does."""
        self._samplers: dict[str, _Sampler] = {}
        self._futures: dict[str, _Future] = {}

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        if self._device is None:
            from services.models.loading import torch_device

            self._device = torch_device()
        return self._device

    def _engine(self, base: BaseModel_) -> Engine:
        """The local loop, or the pass-through to Tinker for a base model the operator runs there."""
        if base.backend != "tinker":
            return self.engine
        with self._lock:
            if self._cloud is None:
                from services.training.tinker_api.cloud_engine import CloudEngine

                self._cloud = CloudEngine(self.context.secrets)
            return self._cloud

    def _base(self, name: str | None, param: str = "base_model") -> BaseModel_:
        base = self.config.base_model(name) if name else None
        if base is None or base.backend not in ENGINE_BACKENDS:
            raise NotFound(f"base model {name!r} is not offered for Tinker training by this gym", param=param)
        return base

    def _base_path(self, base: BaseModel_) -> Path:
        from services.models.loading import resolve_model_dir

        return Path(resolve_model_dir(base, self.models_dir))

    def _submit(self, run_id: str, worker: concurrent.futures.ThreadPoolExecutor, work: Callable[[], Outcome],
                on_error: Callable[[], None] | None = None, *, owner: str | None = None,
                reservation: Any = None) -> str:
        """``work`` queued on ``worker``; its future's request id. When the worker was shut down
        (its model closed since the call looked it up: unloaded, or its session ended), the call
        is refused and its hold (``reservation``) released."""
        request_id = new_id("req")

        def run() -> Outcome:
            try:
                return work()
            except BaseException as err:  # noqa: BLE001 - every failure is the future's answer
                if on_error is not None:
                    on_error()
                return Outcome(error=_fail(err))

        try:
            done = worker.submit(run)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            if reservation is not None:
                self.ledger.release(reservation.id)
            raise self._closed(run_id, owner) from None
        with self._lock:
            self._futures[request_id] = _Future(run_id, done)
            if len(self._futures) > MAX_FINISHED_FUTURES:  # forget the oldest answered futures
                for rid in [r for r, f in self._futures.items() if f.done.done()][: len(self._futures) // 4]:
                    del self._futures[rid]
        return request_id

    def future(self, identity: Identity, request_id: str) -> concurrent.futures.Future[Outcome]:
        with self._lock:
            found = self._futures.get(request_id)
        if found is None or found.run_id != identity.run_id:
            raise NotFound(f"future {request_id} not found", param="request_id")
        return found.done

    def _model(self, identity: Identity, model_id: str) -> _Model:
        with self._lock:
            model = self._models.get(self._aliases.get(model_id, model_id))
            if model is not None and model.run_id == identity.run_id:
                self._beat(model.session_id)
        if model is None or model.run_id != identity.run_id:
            raise self._closed(identity.run_id, model_id)
        return model

    def _closed(self, run_id: str, model_id: str | None) -> GymError:
        """The refusal of a call on a training model that is not open: why, when its session's end
        closed it; else 404."""
        with self._lock:
            session_id = self._gone.get(model_id or "")
            session = self._sessions.get(session_id or "")
        if session_id and session is not None and session.run_id == run_id:
            return self._ended(session_id, session, model_id)
        if model_id is None:
            return NotFound("the training model or sampling session was closed before this call was queued")
        return NotFound(f"training model {model_id} not found", param="model_id")

    def _ended(self, session_id: str, session: _Session, model_id: str | None = None) -> SessionEnded:
        what = f"training model {model_id} was closed: its session" if model_id else "session"
        if session.ended == "expired":
            why = (f"expired after {self.session_ttl_s:g} s without a heartbeat (RSIGYM_TINKER_SESSION_TTL_S), "
                   "so its training models were closed and their data registered")
        else:
            why = "was finished (ServiceClient.close())"
        return SessionEnded(f"{what} {session_id} {why}; start a new ServiceClient (saved checkpoints and "
                            "states stay usable)", param="model_id" if model_id else "session_id")

    def _reserve(self, identity: Identity, operation: str, cost: int, model: str, ref: str) -> Any:
        return self.ledger.reserve(identity.key_id, service="training", operation=operation, estimate_nusd=cost,
                                   ref_id=ref, request_id=identity.request_id, chain_ids=identity.chain_ids,
                                   model=model)

    def _metered(self, reservation: Any, cost: int, work: Callable[[], Outcome]) -> Callable[[], Outcome]:
        """``work`` settled at ``cost`` when it ran, its hold released when it did not."""
        def run() -> Outcome:
            try:
                out = work()
            except BaseException:
                self.ledger.release(reservation.id)
                raise
            self.ledger.settle(reservation.id, cost)
            return out
        return run

    # -- sessions ------------------------------------------------------------------------------

    def create_session(self, identity: Identity) -> dict[str, Any]:
        session_id = new_id("sess")
        with self._lock:
            self._sessions[session_id] = _Session(run_id=identity.run_id, beat=time.monotonic())
        self._start_reaper()
        return {"type": "create_session", "session_id": session_id}

    def _beat(self, session_id: str | None) -> None:
        """A sign of life of an open session (the caller holds the lock)."""
        session = self._sessions.get(session_id or "")
        if session is not None and session.ended is None:
            session.beat = time.monotonic()

    def _session(self, identity: Identity, session_id: str) -> str:
        """The open session ``session_id`` of the caller's run (a sign of life of it); 404 when
        there is none, 410 ``session_ended`` when it has ended."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.run_id == identity.run_id:
                self._beat(session_id)
        if session is None or session.run_id != identity.run_id:
            raise NotFound(f"session {session_id} not found", param="session_id")
        if session.ended is not None:
            raise self._ended(session_id, session)
        return session_id

    def heartbeat(self, identity: Identity, session_id: str) -> dict[str, Any]:
        self._session(identity, session_id)
        return {"type": "session_heartbeat"}

    def finish_session(self, identity: Identity, session_id: str) -> None:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None or session.run_id != identity.run_id:
            raise NotFound(f"session {session_id} not found", param="session_id")
        # Answered once each model's queued calls ran and its loop data was registered (the SDK's
        # ``ServiceClient.close()`` waits for this answer). A session that ended already (finished,
        # or expired) has nothing left to finish: the first end wins, as on Tinker.
        concurrent.futures.wait(self._end(session_id, "finished") or [], timeout=FINISH_WAIT_S)

    def _end(self, session_id: str, how: str, *,
             silent_since: float | None = None) -> list[concurrent.futures.Future[None]] | None:
        """End an open session: its training models closed after their queued calls (each future
        done once the model's loop data is registered and its job recorded). None when it had
        ended already, or (``silent_since``) showed a sign of life since."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.ended is not None or (
                    silent_since is not None and session.beat > silent_since):
                return None
            session.ended, session.ended_at = how, time.monotonic()
            models = [m for m in self._models.values() if m.session_id == session_id]
            for model in models:
                names = [model.id, *(a for a, m in self._aliases.items() if m == model.id)]
                session.closed.extend(names)
                self._gone.update(dict.fromkeys(names, session_id))
        return [self._close_model(model) for model in models]

    # -- expiry of silent sessions -------------------------------------------------------------

    def _start_reaper(self) -> None:
        """The reaper thread, started with a session (none when sessions never expire)."""
        if self.session_ttl_s <= 0 or self._reaper is not None:
            return
        with self._lock:
            if self._reaper is not None:
                return
            stop = threading.Event()
            thread = threading.Thread(target=self._reap, args=(stop,), name="tinker-session-reaper", daemon=True)
            self._reaper = (thread, stop)
        thread.start()

    def _reap(self, stop: threading.Event) -> None:
        interval = min(REAP_INTERVAL_MAX_S, max(0.05, self.session_ttl_s / 4))
        while not stop.wait(interval):
            try:
                self.expire_silent_sessions()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("the Tinker session reaper failed")

    def expire_silent_sessions(self, now: float | None = None) -> list[str]:
        """End every open session silent for longer than the TTL, as its client's finish would
        (without waiting for its models' last calls); forget sessions ended long ago. Returns the
        sessions it expired."""
        now = time.monotonic() if now is None else now
        if self.session_ttl_s <= 0:
            return []
        deadline = now - self.session_ttl_s
        with self._lock:
            silent = [(sid, s.run_id) for sid, s in self._sessions.items() if s.ended is None and s.beat < deadline]
            for sid in [sid for sid, s in self._sessions.items()
                        if s.ended is not None and now - s.ended_at > ENDED_SESSIONS_KEPT_S]:
                for name in self._sessions.pop(sid).closed:
                    self._gone.pop(name, None)
        expired = []
        for session_id, run_id in silent:
            closing = self._end(session_id, "expired", silent_since=deadline)
            if closing is None:
                continue
            expired.append(session_id)
            log.info("Tinker session %s of run %s expired after %g s without a heartbeat: closing its %d training "
                     "model(s)", session_id, run_id, self.session_ttl_s, len(closing))
            for done in closing:
                done.add_done_callback(_log_close_failure)
        return expired

    def _close_model(self, model: _Model) -> concurrent.futures.Future[None]:
        with self._lock:
            self._models.pop(model.id, None)
            for alias in [a for a, m in self._aliases.items() if m == model.id]:
                del self._aliases[alias]

        def close() -> None:  # after the calls already queued: their loop data is in the last segment
            session, model.engine_session = model.engine_session, None
            if session is not None and hasattr(session, "close"):
                session.close()
            self._record_job(model, "succeeded")

        closed = model.worker.submit(close)
        model.worker.shutdown(wait=False)
        with self.store.transaction() as s:
            s.execute(update(TrainingJob).where(TrainingJob.id == model.id)
                      .values(status="succeeded", step=model.optim_steps))
        return closed

    # -- what the audit reads of a loop ---------------------------------------------------------

    def _register_loop_data(self, model: _Model) -> None:
        """The model's loop rows not yet registered become a dataset of the run (loop_data.py)."""
        view = self.loop.register(model.id, run_id=model.run_id, key_id=model.key_id)
        if view is not None and view["sha256"] not in {d["sha256"] for d in model.datasets}:
            model.datasets.append({"id": view["id"], "sha256": view["sha256"]})

    def _record_job(self, model: _Model, status: str) -> None:
        """Register the loop data so far and append the model's ``training.job`` event (its
        datasets, its checkpoints so far): what provenance and the contamination attribution read.
        A model is recorded at every checkpoint and at its end; the last event is its current one."""
        try:
            self._register_loop_data(model)
        finally:  # the event even when the data could not be registered: provenance then flags the gap
            outputs = self.registry.ids_of_job(model.id)
            with self.store.transaction() as s:
                s.execute(update(TrainingJob).where(TrainingJob.id == model.id)
                          .values(dataset_ids=[d["id"] for d in model.datasets]))
                self.events.append(s, run_id=model.run_id, kind=TRAINING_JOB, key_id=model.key_id,
                                   experiment_id=model.experiment_id,
                                   data={"job_id": model.id, "status": status, "base_model": model.base.name,
                                         "input_checkpoint": self._parent_checkpoint(model),
                                         "config_hash": self._config_hash(model), "datasets": list(model.datasets),
                                         "loss_module_hash": None, "output_checkpoints": outputs,
                                         "steps": model.optim_steps, "tinker": {"parent": model.parent}})

    def shutdown(self) -> None:
        with self._lock:
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper[1].set()
            reaper[0].join(timeout=5)
        with self._lock:
            models = list(self._models.values())
            workers = [m.worker for m in models] + [p.worker for p in self._samplers.values()]
        for worker in workers:
            worker.shutdown(wait=False, cancel_futures=True)
        for model in models:  # what the open loops trained on still reaches the audit
            try:
                self._record_job(model, "cancelled")
            except Exception:  # noqa: BLE001 - the service is going down; the rows stay on disk
                log.exception("could not register the loop data of %s at shutdown", model.id)
        cloud = self._cloud
        close = getattr(cloud, "close", None)
        if close is not None:  # the upstream session finished (else it expires by its missed heartbeats)
            close()

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [
            {"model_name": m.name, "max_context_length": m.max_context, "trainable": True, "sampleable": True}
            for m in self.config.models if m.backend in ENGINE_BACKENDS]}

    # -- training models -----------------------------------------------------------------------

    def create_model(self, identity: Identity, body: dict[str, Any], *, parent: str | None = None,
                     rank: int | None = None) -> tuple[_Model, str]:
        session_id = self._session(identity, str(body.get("session_id")))
        lora = body.get("lora_config") or {}
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise Unprocessable(f"optimizer {optimizer!r} is not offered: this gym trains with AdamW",
                                param="optimizer_config")
        values = check_fields(identity.policies, {"base_model": body.get("base_model"),
                                                  "lora.rank": rank if rank is not None else lora.get("rank"),
                                                  "seed": lora.get("seed"), "parent_checkpoint": parent},
                              model=body.get("base_model"))
        base = self._base(values["base_model"])
        rank_ = int(values["lora.rank"] or 16)
        seed = int(values["seed"] or 0)
        if not 1 <= rank_ <= 256:
            raise Unprocessable("lora_config.rank must be between 1 and 256", param="lora_config.rank")
        model_id = new_id("ftjob")
        config = {"tinker": True, "base_model": base.name, "lora": {"rank": rank_}, "seed": seed}
        continues = [e for e in [self._state_experiment(identity, parent)] if e]
        with self.store.transaction() as s:  # the job and its experiment commit together, or neither
            experiment_id = self.experiments.resolve(s, run_id=identity.run_id, key_id=identity.key_id,
                                                     experiment_id=None, name=f"tinker {parent or base.name}",
                                                     continues=continues)
            s.add(TrainingJob(id=model_id, run_id=identity.run_id, key_id=identity.key_id, status=INTERACTIVE,
                              base_model=base.name, parent_checkpoint_id=None, dataset_ids=[], config=config,
                              config_hash=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(),
                              loss_module_hash=None, total_steps=0, queue="tinker", experiment_id=experiment_id))
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"tinker-{model_id}")
        model = _Model(id=model_id, run_id=identity.run_id, key_id=identity.key_id, session_id=session_id,
                       base=base, rank=rank_, seed=seed, engine_session=None, worker=worker, parent=parent,
                       experiment_id=experiment_id)
        with self._lock:
            session = self._sessions.get(session_id)
            open_ = session is not None and session.ended is None
            if open_:  # (checked with the insertion: an ending session collects its models under this lock)
                self._models[model_id] = model
                if isinstance(body.get("model_seq_id"), int):
                    self._aliases[f"{session_id}:train:{body['model_seq_id']}"] = model_id
        if not open_:  # its session ended while the job row was written: the row is finished at once
            self._close_model(model)
            if session is None:
                raise NotFound(f"session {session_id} not found", param="session_id")
            raise self._ended(session_id, session)

        def work() -> Outcome:
            model.engine_session = self._engine(base).training(base_path=self._base_path(base), rank=rank_,
                                                               seed=seed, device=self.device, base=base)
            return Outcome(json={"type": "create_model", "model_id": model_id})

        def failed() -> None:
            self._close_model(model)

        return model, self._submit(identity.run_id, worker, work, on_error=failed, owner=model_id)

    def _state_experiment(self, identity: Identity, parent: str | None) -> str | None:
        """The experiment of the model that saved the state ``parent`` names (None: no state)."""
        if not parent:
            return None
        try:
            _, meta = self._state(identity, parent)
        except NotFound:
            return None
        found = meta.get("experiment_id")
        return str(found) if found else None

    def get_info(self, identity: Identity, model_id: str) -> dict[str, Any]:
        model = self._model(identity, model_id)
        return {"type": "get_info", "model_id": model.id, "model_name": model.base.name, "is_lora": True,
                "lora_rank": model.rank, "model_data": {"arch": "causal_lm", "model_name": model.base.name,
                                                        "tokenizer_id": None}}

    def unload(self, identity: Identity, model_id: str) -> str:
        model = self._model(identity, model_id)

        def work() -> Outcome:
            self._close_model(model)
            return Outcome(json={"type": "unload_model", "model_id": model_id})

        return self._submit(identity.run_id, model.worker, work, owner=model_id)

    def forward_backward(self, identity: Identity, raw: bytes) -> tuple[str, str]:
        request = protowire.decode_forward_backward(raw)
        model = self._model(identity, request.model_id)
        if not request.data:
            raise Unprocessable("forward_backward needs at least one datum", param="data")
        if request.loss_fn not in LOSS_FNS:
            raise Unprocessable(f"loss function {request.loss_fn!r} is not offered; one of {sorted(LOSS_FNS)}",
                                param="loss_fn")
        if not request.forward_only:
            check_fields(identity.policies, {"loss": request.loss_fn})
        tokens = sum(len(d.tokens) for d in request.data)
        if any(len(d.tokens) > model.base.max_context for d in request.data):
            raise Unprocessable(f"a datum is longer than {model.base.name}'s context ({model.base.max_context} tokens)",
                                param="data")
        cost = token_cost_nusd(tokens, model.base.train_usd_per_mtok)
        op = "tinker.forward" if request.forward_only else "tinker.forward_backward"
        reservation = self._reserve(identity, op, cost, model.base.name, model.id)
        data = [self._engine(model.base).datum(d.tokens, d.loss_fn_inputs) for d in request.data]

        def work() -> Outcome:
            session = model.engine_session
            if session is None:
                raise Unprocessable("this training model is not loaded (its creation failed or it was unloaded)")
            if not request.forward_only:  # written before it trains: nothing is trained unrecorded
                self.loop.trained(model.id, self._base_path(model.base), request.data, request.loss_fn,
                                  model.optim_steps)
            call = session.forward if request.forward_only else session.forward_backward
            result = call(data, request.loss_fn, dict(request.loss_fn_config))
            if not request.forward_only:
                model.loss_fns.add(request.loss_fn)
            outputs = [{k: list(v) for k, v in out.items()} for out in result.loss_fn_outputs]
            return Outcome(proto=protowire.encode_forward_backward_output(outputs, dict(result.metrics or {})))

        return model.id, self._submit(identity.run_id, model.worker, self._metered(reservation, cost, work),
                                      owner=request.model_id, reservation=reservation)

    def optim_step(self, identity: Identity, body: dict[str, Any]) -> tuple[str, str]:
        model = self._model(identity, str(body.get("model_id")))
        params = body.get("adam_params") or body.get("optim_params")
        if not isinstance(params, dict) or body.get("optimizer_params") is not None:
            raise Unprocessable("optim_step takes adam_params: this gym trains with AdamW", param="adam_params")
        checked = check_fields(identity.policies, {"learning_rate": params.get("learning_rate", 1e-4)})
        params = {**params, "learning_rate": checked["learning_rate"]}
        adam = self._engine(model.base).adam(params)

        def work() -> Outcome:
            if model.engine_session is None:
                raise Unprocessable("this training model is not loaded")
            metrics = model.engine_session.optim_step(adam)
            model.optim_steps += 1
            model.adam = params
            return Outcome(json={"type": "optim_step", "metrics": dict(metrics or {})})

        return model.id, self._submit(identity.run_id, model.worker, work, owner=model.id)

    # -- weights -------------------------------------------------------------------------------

    def _config_hash(self, model: _Model) -> str:
        config = {"tinker": True, "base_model": model.base.name, "lora": {"rank": model.rank}, "seed": model.seed,
                  "loss_fns": sorted(model.loss_fns), "adam": model.adam}
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()

    def save_for_sampler(self, identity: Identity, body: dict[str, Any]) -> tuple[str, str]:
        model = self._model(identity, str(body.get("model_id")))
        name = body.get("path")

        def work() -> Outcome:
            session = model.engine_session
            if session is None:
                raise Unprocessable("this training model is not loaded")
            if name is None:  # save_weights_and_get_sampling_client: an unregistered, session-only sampler
                adapter = self.scratch_dir / new_id("sampler")
                private_dir(adapter.parent)
                session.save_weights_for_sampler(adapter)
                sampler = self._new_sampler(identity.run_id, model.base, None, adapter, owner=model.id,
                                            session_id=model.session_id, ephemeral=True)
                return Outcome(json={"type": "save_weights_for_sampler", "sampling_session_id": sampler.id})

            class _Adapter:
                @staticmethod
                def save_pretrained(path: Path) -> None:
                    session.save_weights_for_sampler(Path(path))

            self._register_loop_data(model)
            view = self.registry.save(
                model=_Adapter(), run_id=model.run_id, job_id=model.id, base_model=model.base.name,
                parent=self._parent_checkpoint(model), dataset_hashes=[d["sha256"] for d in model.datasets],
                config_hash=self._config_hash(model), loss_module_hash=None, step=model.optim_steps,
                metrics={"tinker": {"name": str(name), "loss_fns": sorted(model.loss_fns),
                                    "optim_steps": model.optim_steps, "parent": model.parent}},
                experiment_id=model.experiment_id, events=self.events, key_id=identity.key_id)
            self._record_job(model, INTERACTIVE)
            return Outcome(json={"type": "save_weights_for_sampler", "checkpoint_id": view["id"],
                                 "path": f"{TINKER_PREFIX}{model.id}/sampler_weights/{view['id']}"})

        return model.id, self._submit(identity.run_id, model.worker, work, owner=model.id)

    @staticmethod
    def _parent_checkpoint(model: _Model) -> str | None:
        """The registered checkpoint this model started from (a sampler-weights path), else None:
        a model from the base, or from a saved state, names its state in the provenance metrics."""
        if model.parent and "/sampler_weights/" in model.parent:
            return model.parent.rsplit("/", 1)[-1]
        return None

    def save_state(self, identity: Identity, body: dict[str, Any]) -> tuple[str, str]:
        model = self._model(identity, str(body.get("model_id")))
        name = str(body.get("path") or "state")

        def work() -> Outcome:
            session = model.engine_session
            if session is None:
                raise Unprocessable("this training model is not loaded")
            self._record_job(model, INTERACTIVE)  # the state carries the loop data so far
            state_id = new_id("state")
            private_dir(self.states_dir)
            tmp = self.states_dir / f".{state_id}.partial"
            try:
                session.save_state(tmp)
                lock_down(tmp)
                stored = tree_bytes(tmp)
                self.quota.check_object("checkpoints", stored, param=None)
                self.quota.require(model.run_id, "checkpoints", stored, param=None)
                meta = {"run_id": model.run_id, "model_id": model.id, "base_model": model.base.name,
                        "rank": model.rank, "seed": model.seed, "name": name, "bytes": stored,
                        "datasets": list(model.datasets), "experiment_id": model.experiment_id,
                        "loss_fns": sorted(model.loss_fns),
                        "parent": model.parent, "weights_hash": hash_dir(tmp)}
                (tmp / "tinker_state.json").write_text(json.dumps(meta))
                final = self.states_dir / state_id
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            try:
                with self.store.transaction() as s:
                    self.quota.charge(s, model.run_id, "checkpoints", stored, param=None)
            except BaseException:
                shutil.rmtree(final, ignore_errors=True)
                raise
            return Outcome(json={"type": "save_weights", "path": f"{TINKER_PREFIX}{model.id}/weights/{state_id}"})

        return model.id, self._submit(identity.run_id, model.worker, work, owner=model.id)

    def _state(self, identity: Identity, path: str) -> tuple[Path, dict[str, Any]]:
        parts = path[len(TINKER_PREFIX):].split("/") if path.startswith(TINKER_PREFIX) else []
        if len(parts) != 3 or parts[1] != "weights" or not parts[2].startswith("state_"):
            raise NotFound(f"saved state {path!r} not found (a path save_state returned)", param="path")
        where = self.states_dir / parts[2]
        try:
            meta = json.loads((where / "tinker_state.json").read_text())
        except (OSError, ValueError):
            meta = None
        if meta is None or meta.get("run_id") != identity.run_id:
            raise NotFound(f"saved state {path!r} not found", param="path")
        return where, meta

    def load_state(self, identity: Identity, body: dict[str, Any]) -> tuple[str, str]:
        path = str(body.get("path") or "")
        where, meta = self._state(identity, path)
        optimizer = bool(body.get("optimizer"))
        if body.get("model_id"):
            model = self._model(identity, str(body["model_id"]))
            if model.base.name != meta["base_model"] or model.rank != meta["rank"]:
                raise Unprocessable(f"state {path} is of another base model or LoRA rank than this model",
                                    param="path")
            check_fields(identity.policies, {"parent_checkpoint": path})
        else:  # create-via-load: a new model, made from the state's base and rank, then loaded
            model, _ = self.create_model(identity, {"session_id": body.get("session_id"),
                                                    "model_seq_id": body.get("model_seq_id"),
                                                    "base_model": body.get("base_model") or meta["base_model"],
                                                    "lora_config": {"rank": meta["rank"], "seed": meta.get("seed")}},
                                         parent=path, rank=meta["rank"])

        def work() -> Outcome:
            if model.engine_session is None:
                raise Unprocessable("this training model is not loaded")
            model.engine_session.load_state(where, with_optimizer=optimizer)
            model.parent = path
            model.datasets = [d for d in meta.get("datasets") or [] if isinstance(d, dict)]
            model.loss_fns = set(meta.get("loss_fns") or [])
            return Outcome(json={"type": "load_weights", "path": path, "model_id": model.id})

        return model.id, self._submit(identity.run_id, model.worker, work, owner=model.id)

    # -- sampling ------------------------------------------------------------------------------

    def _new_sampler(self, run_id: str, base: BaseModel_, model_path: str | None, adapter: Path,
                     *, owner: str, session_id: str | None, ephemeral: bool = False) -> _Sampler:
        sampler = _Sampler(id=new_id("sampler"), run_id=run_id, base=base, model_path=model_path,
                           adapter_dir=adapter, owner=owner, session_id=session_id, ephemeral=ephemeral,
                           worker=concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-sampler"))
        with self._lock:
            self._samplers[sampler.id] = sampler
        return sampler

    def create_sampling_session(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        session_id = self._session(identity, str(body.get("session_id")))
        model_path, base_name = body.get("model_path"), body.get("base_model")
        if model_path:
            parts = str(model_path)[len(TINKER_PREFIX):].split("/") if str(model_path).startswith(TINKER_PREFIX) else []
            if len(parts) != 3 or parts[1] != "sampler_weights":
                raise NotFound(f"sampler weights {model_path!r} not found (a path save_weights_for_sampler "
                               "returned)", param="model_path")
            row = self.registry.get(parts[2], run_id=identity.run_id)
            base_name, adapter, owner = row.base_model, Path(row.path), row.job_id
        else:
            raise Unprocessable("sampling the bare base model is not offered through the Tinker API: sample a "
                                "saved model_path, or the base model through /inference/v1", param="base_model")
        check_fields(identity.policies, {}, model=base_name)
        sampler = self._new_sampler(identity.run_id, self._base(base_name), model_path, adapter, owner=owner,
                                    session_id=session_id)
        return {"type": "create_sampling_session", "sampling_session_id": sampler.id}

    def _sampler(self, identity: Identity, sampler_id: str) -> _Sampler:
        with self._lock:
            sampler = self._samplers.get(sampler_id)
            if sampler is not None and sampler.run_id == identity.run_id:
                self._beat(sampler.session_id)
        if sampler is None or sampler.run_id != identity.run_id:
            raise NotFound(f"sampling session {sampler_id} not found", param="sampling_session_id")
        return sampler

    def sampler_info(self, identity: Identity, sampler_id: str) -> dict[str, Any]:
        sampler = self._sampler(identity, sampler_id)
        return {"sampler_id": sampler.id, "base_model": sampler.base.name, "model_path": sampler.model_path}

    def sample(self, identity: Identity, body: dict[str, Any]) -> tuple[str, list[str]]:
        if body.get("sampling_session_id") is None:
            raise Unprocessable("sample needs a sampling session (create_sampling_client)", param="sampling_session_id")
        sampler = self._sampler(identity, str(body["sampling_session_id"]))
        for unsupported in ("prompt_logprobs", "record_stability_info"):
            if body.get(unsupported):
                raise Unprocessable(f"{unsupported} is not supported by this gym's Tinker API", param=unsupported)
        for unsupported in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(unsupported):
                raise Unprocessable(f"{unsupported} is not supported by this gym's Tinker API", param=unsupported)
        tokens: list[int] = []
        for chunk in (body.get("prompt") or {}).get("chunks") or []:
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise Unprocessable("only token (encoded_text) prompt chunks are supported", param="prompt")
            tokens.extend(int(t) for t in chunk.get("tokens") or [])
        num = int(body.get("num_samples") or 1)
        if not tokens or not 1 <= num <= 64:
            raise Unprocessable("sample needs prompt tokens and 1 to 64 samples", param="num_samples")
        params = dict(body.get("sampling_params") or {})
        room = sampler.base.max_context - len(tokens)
        if room < 1:
            raise Unprocessable(f"the prompt fills {sampler.base.name}'s context", param="prompt")
        params["max_tokens"] = min(int(params.get("max_tokens") or room), room)
        max_new = params["max_tokens"]
        estimate = (token_cost_nusd(len(tokens), sampler.base.prefill_usd_per_mtok)
                    + token_cost_nusd(max_new * num, sampler.base.sample_usd_per_mtok))
        reservation = self._reserve(identity, "tinker.sample", estimate, sampler.base.name, sampler.id)
        sampling = self._engine(sampler.base).sampling_params(params)

        def work() -> Outcome:
            try:
                if sampler.engine_session is None:
                    sampler.engine_session = self._engine(sampler.base).sampler(
                        base_path=self._base_path(sampler.base), adapter_dir=sampler.adapter_dir, device=self.device,
                        base=sampler.base)
                sequences = sampler.engine_session.sample(tokens, num, sampling)
                self._record_samples(identity, sampler, tokens, [list(s.tokens) for s in sequences])
            except BaseException:
                self.ledger.release(reservation.id)
                raise
            generated = sum(len(s.tokens) for s in sequences)
            cost = (token_cost_nusd(len(tokens), sampler.base.prefill_usd_per_mtok)
                    + token_cost_nusd(generated, sampler.base.sample_usd_per_mtok))
            self.ledger.settle(reservation.id, min(cost, estimate))
            return Outcome(proto=protowire.encode_sample_response([
                protowire.WireSequence([int(t) for t in s.tokens], None if s.logprobs is None else
                                       [float(x) for x in s.logprobs], str(s.stop_reason)) for s in sequences]))

        request_id = self._submit(identity.run_id, sampler.worker, work, reservation=reservation)
        return request_id, [f"{request_id}-{i}" for i in range(num)]

    def _record_samples(self, identity: Identity, sampler: _Sampler, prompt: list[int],
                        sequences: list[list[int]]) -> None:
        """The rollouts as loop rows of the model the sampler descends from: registered with that
        model's next checkpoint or its end, or at once when it has ended already."""
        self.loop.sampled(sampler.owner, self._base_path(sampler.base), prompt, sequences, sampler_id=sampler.id,
                          model_path=sampler.model_path)
        with self._lock:
            open_ = sampler.owner in self._models
        if not open_:
            self.loop.register(sampler.owner, run_id=sampler.run_id, key_id=identity.key_id)
