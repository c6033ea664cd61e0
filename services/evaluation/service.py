"""Evaluation service: benchmarks, harness uploads, evaluation jobs, submissions, scoring.

What a run may see follows its key's policy: hidden splits are neither listed nor run for
agents, and an ``aggregate`` key gets scores and progress but no per-task results or
trajectories. Operator calls (signed operator identities from the gateway's admin routes)
register benchmarks, score runs under the operator's own key, and read every score.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from access.keys import KeyRegistry
from access.policy import Policy
from access.presets import parse_track, submission_needs
from billing.deadlines import check_run_open, check_run_open_in, end_run_now
from billing.money import usd_to_nusd
from billing.storage_quota import StorageQuota
from kit.errors import (
    Conflict,
    NotFound,
    PermissionDenied,
    ServiceUnavailable,
    Unprocessable,
    validated,
)
from kit.identity import Identity
from kit.ids import new_id
from kit.spec import ServiceContext
from services.evaluation.comparisons import dev_comparison
from services.evaluation.decompose import cell_plans, trivial_reason
from services.evaluation.failures import failure_kind
from services.evaluation.harnesses import MINIMAL, HarnessStore
from services.evaluation.jobs import EvaluationRunner
from services.evaluation.read import OPERATOR_KEY_NAME
from services.evaluation.registry import BenchmarkRegistry, benchmark_view
from services.evaluation.report import agent_label
from services.evaluation.schemas import (
    BASELINE_RUNS,
    INITIAL_RUN,
    REFERENCE_RUN,
    JobRequest,
    ScoreRequest,
    SubmissionRequest,
)
from services.evaluation.submissions import final_submission
from services.evaluation.subsets import draw_subset, split_seed_name
from services.evaluation.tables import BenchmarkRow, EvaluationJob, ScoreRow, SubmissionRow, TrialResultRow
from services.records.events import CALL_REFUSED, SUBMISSION, EventLog
from services.records.experiments import Experiment, ExperimentRegistry
from services.records.live_integrity import LiveIntegrity
from services.training.checkpoints import CheckpointRegistry
from storage.tables import ApiKey, RunGeneration

log = logging.getLogger("rsigym.evaluation")
OPERATOR_BUDGET_USD = 1_000_000.0


def _detail(identity: Identity) -> Literal["full", "aggregate"]:
    if identity.operator:
        return "full"
    return "aggregate" if any(p.detail == "aggregate" for p in identity.policies) else "full"


def job_view(job: EvaluationJob) -> dict[str, Any]:
    return {
        "id": job.id, "object": "evaluation.job", "purpose": job.purpose, "status": job.status,
        "benchmark": job.benchmark, "split": job.split, "model": job.model, "harness": job.harness,
        "attempts": job.attempts, "sampling": job.sampling, "tasks": len(job.task_ids), "experiment": job.experiment_id,
        "progress": {"done": job.trials_done, "total": job.trials_total}, "score": job.score, "error": job.error,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }


def result_view(r: TrialResultRow) -> dict[str, Any]:
    return {"task_id": r.task_id, "attempt": r.attempt, "reward": r.reward, "error": r.error,
            "failure_kind": failure_kind(r.reward, r.error, r.failure_kind),
            "trajectory": r.trajectory, "verifier_output": r.verifier_output, "agent_output": r.agent_output,
            "sandbox_id": r.sandbox_id, "started_at": r.started_at, "finished_at": r.finished_at,
            **({"judge": r.judge} if r.judge is not None else {})}


class EvaluationService:
    def __init__(self, context: ServiceContext):
        self.context = context
        self.store = context.store
        self.config = context.config
        data = context.data_dir / "evaluation"
        self.events = EventLog(self.store, context.internal_secret)
        self.experiments = ExperimentRegistry(self.events)
        self.registry = BenchmarkRegistry(self.store, data / "benchmarks", audit=self.config.audit,
                                          rollout=self.config.rollout)
        self.harnesses = HarnessStore(self.store, data / "harnesses", events=self.events,
                                      quota=StorageQuota.of(context))
        self.keys = KeyRegistry(self.store)
        self.checkpoints = CheckpointRegistry.of(context)  # reads only
        self.runner = EvaluationRunner(self.store, self.registry, self.harnesses, data / "trials",
                                       workers=context.config.evaluation.workers,
                                       trial_concurrency=context.config.evaluation.trial_concurrency,
                                       workers_per_job=context.config.evaluation.workers_per_job,
                                       max_running_per_run=context.config.evaluation.max_running_per_run,
                                       gateway_url=lambda: context.settings.gateway_url, events=self.events,
                                       operator_key=self._operator_key)
        self.integrity = LiveIntegrity(self.store, self.config, context.data_dir, self.events)

    # -- benchmarks --------------------------------------------------------------------

    def list_benchmarks(self, identity: Identity) -> list[dict[str, Any]]:
        return [benchmark_view(r, operator=identity.operator) for r in self.registry.list()]

    def training_pool(self, identity: Identity, name: str) -> Path:
        """The registered copy of a benchmark's training pool (public: it is disjoint from every task)."""
        return self.registry.pool_path(name)

    def register_benchmark(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        self._operator(identity)
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise Unprocessable("give the benchmark's directory or .tar.gz path on the gym's host", param="path")
        seed_file = body.get("seed_file")  # the seed of generated splits (services/evaluation/official_splits.py)
        if seed_file is not None and (not isinstance(seed_file, str) or not seed_file):
            raise Unprocessable("seed_file is a path on the gym's host", param="seed_file")
        row, bench = self.registry.register(path, replace=bool(body.get("replace")), seed_file=seed_file)
        model = self.config.models[0].name
        task_ids = [t.id for _, t in bench.tasks()]
        job = self._new_job(run_id="operator", key_id=self._operator_key(),
                            purpose="validation", benchmark=bench.name, split="*", model=model, harness=MINIMAL,
                            attempts=1, sampling={}, task_ids=task_ids, trials=2 * len(task_ids))
        self.registry.set_validation_job(bench.name, job.id)
        self.runner.submit(job.id)
        return benchmark_view(self.registry.get(bench.name), operator=True)

    # -- harnesses ---------------------------------------------------------------------

    def upload_harness(self, identity: Identity, raw: bytes) -> dict[str, Any]:
        if not raw:
            raise Unprocessable("send the harness archive (.tar.gz) as the request body")
        return self.harnesses.upload(run_id=identity.run_id, key_id=identity.key_id, raw=raw)

    # -- jobs --------------------------------------------------------------------------

    def create_job(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        req = validated(JobRequest, body, what="request")
        self._check_model(identity, req.model)  # first: a refused model is refused whatever the benchmark
        bench_row = self.registry.get(req.benchmark)
        if bench_row.validation.get("status") != "ready":
            raise Conflict(f"benchmark {req.benchmark!r} is not ready ({bench_row.validation.get('status')})",
                           param="benchmark")
        split = bench_row.splits.get(req.split)
        if split is not None and split.get("hidden") and not identity.operator:
            # The agent gets a plain 404; the platform keeps the attempt on the run's record (the
            # behaviour audit reads it as protected_file_access, ATTEMPTED_BLOCKED).
            self.events.record(run_id=identity.run_id, kind=CALL_REFUSED, key_id=identity.key_id, data={
                "where": "service", "service": "evaluation", "operation": "jobs.create", "status": 404,
                "error": "not_found", "rule": f"hidden split {req.split!r} of {req.benchmark!r} requested by an agent",
                "param": "split"})
        if split is None or (split.get("hidden") and not identity.operator):
            raise NotFound(f"split {req.split!r} of {req.benchmark!r} not found"
                           + (" (it is hidden from agents)" if split is not None else ""), param="split")
        if req.harness != MINIMAL:
            self.harnesses.owned(req.harness, identity.run_id)
        bench = self.registry.load(req.benchmark)
        all_ids = [t.id for t in bench.splits[req.split].tasks]
        if req.tasks is not None:
            unknown = sorted(set(req.tasks) - set(all_ids))
            if unknown:
                raise NotFound(f"tasks not in {req.benchmark}/{req.split}: {', '.join(unknown[:5])}", param="tasks")
            task_ids = [t for t in all_ids if t in set(req.tasks)]
        else:
            task_ids = all_ids
        task_ids = task_ids[: req.limit] if req.limit else task_ids
        produced = (None if self.config.base_model(req.model) is not None  # the checkpoint's own experiment
                    else self.checkpoints.experiment_of(req.model, run_id=identity.run_id))
        job = self._new_job(run_id=identity.run_id, key_id=identity.key_id, purpose="agent",
                            benchmark=req.benchmark, split=req.split, model=req.model, harness=req.harness,
                            attempts=req.attempts, sampling=req.sampling.model_dump(exclude_none=True),
                            task_ids=task_ids, trials=len(task_ids) * req.attempts,
                            experiment=lambda s: self._experiment_of(s, identity, req, produced))
        self.runner.submit(job.id)
        return job_view(job)

    def _experiment_of(self, s: Session, identity: Identity, req: JobRequest, produced: str | None) -> str:
        """Where an agent's evaluation attaches: the experiment it names (its own), else the
        evaluated checkpoint's experiment (``produced``) when this key owns it, else a new
        implicit one that continues the checkpoint's experiment."""
        if req.experiment is None and produced is not None:
            owner = s.get(Experiment, produced)
            if owner is not None and owner.run_id == identity.run_id and owner.owner_key_id == identity.key_id:
                return owner.id
        return self.experiments.resolve(s, run_id=identity.run_id, key_id=identity.key_id,
                                        experiment_id=req.experiment,
                                        name=f"evaluate {req.model} on {req.benchmark}/{req.split}",
                                        continues=[produced] if produced else [])

    def _new_job(self, *, run_id: str, key_id: str, purpose: str, benchmark: str,
                 split: str, model: str, harness: str, attempts: int, sampling: dict[str, Any], task_ids: list[str],
                 trials: int, experiment: Callable[[Session], str] | None = None) -> EvaluationJob:
        """Insert a queued job; ``experiment`` resolves its experiment in the same transaction."""
        url = self.context.settings.gateway_url  # never a request's Host: the trials' keys go there
        if not url:
            raise ServiceUnavailable("evaluations are unavailable: the gym does not know its own address "
                                     "(RSIGYM_GATEWAY_URL, or `rsigym up`'s --host/--port)")
        job = EvaluationJob(id=new_id("evj"), run_id=run_id, key_id=key_id, purpose=purpose, benchmark=benchmark,
                            split=split, model=model, harness=harness, attempts=attempts, sampling=sampling,
                            task_ids=task_ids, gateway_url=url, status="queued", trials_total=trials, trials_done=0)
        with self.store.transaction() as s:
            if experiment is not None:
                job.experiment_id = experiment(s)
            s.add(job)
            s.flush()
            s.expunge(job)
        return job

    def _check_model(self, identity: Identity, model: str, param: str = "model") -> None:
        """A base model, or one of this run's checkpoints (404 otherwise), that every key of the
        chain allows: the evaluation allowlist names base models and admits the run's own
        checkpoints of them, as inference's does (so the gateway does not check it literally)."""
        base = model
        if self.config.base_model(model) is None:
            try:
                base = self.checkpoints.get(model, run_id=identity.run_id).base_model
            except NotFound:
                raise NotFound(f"model {model!r} not found (a base model or one of this run's checkpoints)",
                               param=param) from None
        if not identity.operator and not all(p.allows_model(base) or p.allows_model(model) for p in identity.policies):
            raise PermissionDenied(f"model {model!r} is not in this key's evaluation model allowlist", param=param)

    def _job(self, identity: Identity, job_id: str) -> EvaluationJob:
        with self.store.transaction() as s:
            job = s.get(EvaluationJob, job_id)
            if job is None or (not identity.operator and (job.run_id != identity.run_id or job.purpose != "agent")):
                raise NotFound(f"evaluation job {job_id} not found", param="id")
            s.expunge(job)
            return job

    def get_job(self, identity: Identity, job_id: str) -> dict[str, Any]:
        job = self._job(identity, job_id)
        view = job_view(job)
        view["detail"] = _detail(identity)
        with self.store.transaction() as s:  # its place in the fair queue and how long it waited
            view.update(self.runner.queue_info(s, job))
            comparison = dev_comparison(s, job)  # a checkpoint vs its parent on the same tasks, with its interval
        if comparison is not None:
            view["comparison"] = comparison
        return view

    def list_jobs(self, identity: Identity) -> list[dict[str, Any]]:
        with self.store.transaction() as s:
            q = select(EvaluationJob).where(EvaluationJob.run_id == identity.run_id, EvaluationJob.purpose == "agent")
            return [job_view(j) for j in s.scalars(q.order_by(EvaluationJob.created_at))]

    def results(self, identity: Identity, job_id: str) -> list[dict[str, Any]]:
        job = self._job(identity, job_id)
        if _detail(identity) != "full":
            raise PermissionDenied("this key sees aggregate evaluation results only (scores, not tasks)")
        with self.store.transaction() as s:
            rows = s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job.id)
                             .order_by(TrialResultRow.task_id, TrialResultRow.attempt))
            return [result_view(r) for r in rows]

    def cancel(self, identity: Identity, job_id: str) -> dict[str, Any]:
        job = self._job(identity, job_id)
        with self.store.transaction() as s:
            s.execute(update(EvaluationJob).where(EvaluationJob.id == job.id).values(cancel_requested=True))
        if job.status == "queued":
            self.runner.cancel_queued(job.id)
        return self.get_job(identity, job_id)

    def end_run(self, identity: Identity, run_id: str) -> dict[str, int]:
        """Operator (the run's deadline passed): cancel every open job of the run's agent as
        :meth:`cancel` does (queued ones end at once; running ones at their next check). The
        operator's scoring of the run is not the run's work: scoring ends the run first, and
        the reaper's end of it must not cancel the scoring."""
        self._operator(identity)
        with self.store.transaction() as s:
            jobs = s.execute(select(EvaluationJob.id, EvaluationJob.status).where(
                EvaluationJob.run_id == run_id, EvaluationJob.purpose == "agent",
                EvaluationJob.status.in_(("queued", "running")))).all()
            if jobs:
                s.execute(update(EvaluationJob).where(EvaluationJob.id.in_([j for j, _ in jobs]))
                          .values(cancel_requested=True))
        for job_id, status in jobs:
            if status == "queued":
                self.runner.cancel_queued(job_id)
        return {"jobs_cancelled": len(jobs)}

    # -- submissions and scores --------------------------------------------------------

    def submit(self, identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
        check_run_open(self.store, identity.run_id)  # submissions close at the run's deadline
        req = validated(SubmissionRequest, body, what="request")
        with self.store.transaction() as s:
            track = s.scalar(select(ApiKey.track).where(ApiKey.id == identity.run_id))
        needs, (base_track, _) = submission_needs(track), parse_track(track)
        for part in needs:
            if getattr(req, part) is None:
                raise Unprocessable(f"the {base_track} track submits " + " and ".join(f"a {n}" for n in needs),
                                    param=part)
        if base_track == "data" and req.harness not in (None, MINIMAL):
            raise Unprocessable("the data track keeps the minimal harness", param="harness")
        if base_track == "harness" and req.checkpoint is not None:
            raise Unprocessable("the harness track keeps the base model", param="checkpoint")
        if req.checkpoint is None and req.harness is None:
            raise Unprocessable("submit a checkpoint, a harness, or both")
        if req.checkpoint is not None:
            self._check_model(identity, req.checkpoint)
            model = req.checkpoint
        else:
            model = (req.base_model or (self.config.tracks.instruct_model if base_track == "harness" else None)
                     or self.config.models[0].name)
            if self.config.base_model(model) is None:
                raise NotFound(f"base model {model!r} not found", param="base_model")
            self._check_model(identity, model, param="base_model")
        harness = req.harness or MINIMAL
        if harness != MINIMAL:
            self.harnesses.owned(harness, identity.run_id)
        row = SubmissionRow(id=new_id("sub"), run_id=identity.run_id, key_id=identity.key_id, track=track,
                            checkpoint_id=req.checkpoint, model=model, harness=harness)
        experiment = self.checkpoints.experiment_of(req.checkpoint, run_id=identity.run_id) if req.checkpoint else None
        with self.store.transaction() as s:
            check_run_open_in(s, identity.run_id)  # a submission never lands after the run ended (scoring ends it)
            s.add(row)
            s.flush()
            self.events.append(s, run_id=identity.run_id, kind=SUBMISSION, key_id=identity.key_id,
                               experiment_id=experiment,
                               data={"submission_id": row.id, "checkpoint": req.checkpoint, "model": model,
                                     "harness": harness, "track": track})
        view = submission_view(row)
        # provenance checked now, in the background, for the operator only (live_integrity.py says why not refused)
        self.integrity.submission_created(run_id=identity.run_id, submission=view)
        return view

    def submissions(self, identity: Identity, run_id: str | None = None) -> list[dict[str, Any]]:
        run = run_id if identity.operator and run_id else identity.run_id
        with self.store.transaction() as s:
            rows = s.scalars(select(SubmissionRow).where(SubmissionRow.run_id == run).order_by(SubmissionRow.created_at))
            return [submission_view(r) for r in rows]

    def score_run(self, identity: Identity, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Score a run's final submission on the official splits, avg@k, on the operator's key;
        score the initial system (base model + minimal) the same way once per benchmark, and the
        ``reference`` base model (+ minimal) too when one is named.

        A run started from an earlier run (``--from``: a ``RunGeneration`` row) has that run's
        accepted system as its initial system (the row's ``initial_model`` and ``initial_harness``);
        generation 0 (the chain's base model + minimal) is scored the same way as well, so the run
        has an RSI-Index against both (services/evaluation/generations.py). Both are baseline
        rows (``initial``) shared across runs, cached per system and scope.

        ``subset``/``subset_seed``: every system is scored on the same seeded subset of each split
        (services/evaluation/subsets.py); each score row records the subset, its seed and the
        split's own seed. An open run is ended first (services/evaluation/submissions.py: the
        latest submission before the run ends counts), so what is scored cannot change under the
        scoring. ``submission_id`` (the one ``rsigym score`` audited) must be that final submission.
        ``decompose``: the submitted model × minimal harness and the base model × submitted harness
        too, score rows of the run that name their ``cell`` (services/evaluation/decompose.py)."""
        self._operator(identity)
        req = validated(ScoreRequest, body, what="request")
        if (req.subset is None) != (req.subset_seed is None):
            raise Unprocessable("give subset and subset_seed together (the seed that draws the subset is "
                                "named in every report)", param="subset_seed" if req.subset is not None else "subset")
        if req.reference is not None and self.config.base_model(req.reference) is None:
            raise NotFound(f"reference model {req.reference!r} is not a base model of this gym", param="reference")
        with self.store.transaction() as s:  # what would refuse is refused before the run is ended
            if final_submission(s, run_id) is None:
                raise NotFound(f"run {run_id} has submitted nothing", param="run")
        benches = [r for r in self.registry.list() if r.validation.get("status") == "ready"
                   and (req.benchmarks is None or r.name in req.benchmarks)]
        if not benches:
            raise NotFound("no ready benchmark to score on", param="benchmarks")
        scoped = [(bench.name, *self._scope(bench, req)) for bench in benches if req.split in bench.splits]
        ends_at, ended_now = end_run_now(self.store, run_id)
        with self.store.transaction() as s:
            sub = final_submission(s, run_id)  # read after the end: nothing lands after it
            # the agent (and version) the launcher recorded on the run key; a key minted otherwise: its name
            facts = s.execute(select(ApiKey.agent, ApiKey.agent_version, ApiKey.name).where(ApiKey.id == run_id)).first()
            agent = agent_label({"agent": facts[0], "agent_version": facts[1], "name": facts[2]}) if facts else None
            if sub is None:  # submissions are never deleted: cannot happen
                raise NotFound(f"run {run_id} has submitted nothing", param="run")
            s.expunge(sub)
        if req.submission_id is not None and req.submission_id != sub.id:
            raise Conflict(f"submission {req.submission_id} is not run {run_id}'s final submission ({sub.id}, its "
                           "latest before the run ended): audit the run again and score that one",
                           param="submission_id")
        # (scored run, submission id, model, harness, agent name, decomposition cell); the baselines
        # are scored once per system and scope
        base_model = self._base_of(sub.model)
        generation = self._generation_of(run_id)
        initial = ((generation.initial_model, generation.initial_harness) if generation is not None
                   else (base_model, MINIMAL))
        generation_0 = (generation.base_model, MINIMAL) if generation is not None else initial
        plans: list[tuple[str, str | None, str, str, str | None, str | None]] = [
            (INITIAL_RUN, None, *initial, None, None),
            *([(INITIAL_RUN, None, *generation_0, None, None)] if generation_0 != initial else []),
            *([(REFERENCE_RUN, None, req.reference, MINIMAL, None, None)] if req.reference is not None else []),
            (run_id, sub.id, sub.model, sub.harness, agent or run_id, None),
            *[(run_id, sub.id, model, harness, agent or run_id, cell)  # --decompose: the 2×2's mixed cells
              for cell, model, harness in (cell_plans(sub.model, sub.harness, base_model) if req.decompose else [])]]
        key_id = self._operator_key()
        scores = []
        for benchmark, task_ids, split_seed in scoped:
            for scored_run, submission_id, model, harness, agent_name, cell in plans:
                baseline = scored_run in BASELINE_RUNS
                if baseline and self._baseline(scored_run, benchmark, req, model, harness, split_seed):
                    continue
                job = self._new_job(run_id="operator" if baseline else scored_run,
                                    key_id=key_id, purpose="baseline" if baseline else "score",
                                    benchmark=benchmark, split=req.split, model=model, harness=harness,
                                    attempts=req.attempts, sampling={}, task_ids=task_ids,
                                    trials=len(task_ids) * req.attempts)
                score = ScoreRow(id=new_id("scr"), run_id=scored_run, submission_id=submission_id,
                                 benchmark=benchmark, split=req.split, model=model, harness=harness,
                                 attempts=req.attempts, job_id=job.id, score=None, status="queued", agent=agent_name,
                                 subset=req.subset, subset_seed=req.subset_seed, split_seed=split_seed, cell=cell)
                with self.store.transaction() as s:
                    s.add(score)
                self.runner.submit(job.id)
                scores.append(score_view(score))
        return {"object": "list", "data": scores,
                "run": {"id": run_id, "submission_id": sub.id, "ended_now": ended_now,
                        "ends_at": ends_at.isoformat() if ends_at else None},
                "subset": None if req.subset is None else {"size": req.subset, "seed": req.subset_seed},
                "reference": req.reference,
                "generation": generation_view(generation),
                "decompose": None if not req.decompose else {
                    "cells": [c for c, _, _ in cell_plans(sub.model, sub.harness, base_model)],
                    "trivial": trivial_reason(sub.model, sub.harness, base_model)}}

    def _scope(self, bench: BenchmarkRow, req: ScoreRequest) -> tuple[list[str], str | None]:
        """The task ids scored on ``bench`` (the split's, or its seeded subset: a 422 when the split
        is smaller than the subset) and the split's seed by name."""
        task_ids = [t.id for t in self.registry.load(bench.name).splits[req.split].tasks]
        if req.subset is not None and req.subset_seed is not None:
            task_ids = draw_subset(task_ids, req.subset, req.subset_seed, where=f"{bench.name}/{req.split}")
        return task_ids, split_seed_name(bench.splits, req.split, bench.path)

    def _baseline(self, run: str, benchmark: str, req: ScoreRequest, model: str, harness: str,
                  split_seed: str | None) -> bool:
        """Whether ``run`` (initial or reference) already has a live or finished score of the system
        ``model`` × ``harness`` on exactly these tasks: the same benchmark, split, split seed, subset,
        subset seed and attempts. The harness matters: a later generation's initial system may keep
        the base model with an earlier run's harness, which is not generation 0."""
        with self.store.transaction() as s:
            return s.scalars(select(ScoreRow.id).where(
                ScoreRow.run_id == run, ScoreRow.benchmark == benchmark, ScoreRow.split == req.split,
                ScoreRow.model == model, ScoreRow.harness == harness, ScoreRow.attempts == req.attempts,
                ScoreRow.subset.is_not_distinct_from(req.subset),
                ScoreRow.subset_seed.is_not_distinct_from(req.subset_seed),
                ScoreRow.split_seed.is_not_distinct_from(split_seed),
                ScoreRow.status.in_(("queued", "running", "succeeded")))).first() is not None

    def _base_of(self, model: str) -> str:
        """The base model under ``model`` (a base model's own name; a checkpoint of any run, as the
        platform reads it, so an earlier generation's checkpoint resolves too)."""
        if self.config.base_model(model) is not None:
            return model
        return self.checkpoints.get(model, run_id=None).base_model

    def _generation_of(self, run_id: str) -> RunGeneration | None:
        """The run's generation row (``run start --from``); None: generation 1 (started from the base)."""
        with self.store.transaction() as s:
            row = s.get(RunGeneration, run_id)
            if row is not None:
                s.expunge(row)
            return row

    def _initial_systems(self, runs: dict[str, str], generations: dict[str, dict[str, Any] | None],
                         ) -> dict[str, dict[str, str] | None]:
        """Each scored run's initial system (model, harness) for the score views, ``runs`` mapping
        each to a model it scored: the report pairs a run's score with the initial system's on that
        system, not just on the scope (services/evaluation/report.py). A later generation's is its
        generation row's; a generation-1 run's its base model with the minimal harness. A checkpoint
        that cannot be read: None."""
        bases: dict[str, str | None] = {}
        out: dict[str, dict[str, str] | None] = {}
        for run, model in runs.items():
            g = generations.get(run)
            if g is not None:
                out[run] = {"model": g["initial_model"], "harness": g["initial_harness"]}
                continue
            if model not in bases:
                try:
                    bases[model] = self._base_of(model)
                except NotFound:
                    bases[model] = None
            base = bases[model]
            out[run] = None if base is None else {"model": base, "harness": MINIMAL}
        return out

    def scores(self, identity: Identity) -> list[dict[str, Any]]:
        self._operator(identity)
        with self.store.transaction() as s:
            rows = list(s.scalars(select(ScoreRow).order_by(ScoreRow.created_at)))
            runs = {r.run_id: r.model for r in rows if r.run_id not in BASELINE_RUNS}
            generations = {g.run_id: generation_view(g)
                           for g in s.scalars(select(RunGeneration).where(RunGeneration.run_id.in_(runs)))}
            views = []
            for r in rows:
                job = s.get(EvaluationJob, r.job_id)
                views.append({**score_view(r), "status": job.status if job else r.status,
                              "score": job.score if job and job.status == "succeeded" else r.score,
                              "progress": {"done": job.trials_done, "total": job.trials_total} if job else None})
        systems = self._initial_systems(runs, generations)  # checkpoint reads: their own transactions
        for view in views:
            if view["run_id"] not in BASELINE_RUNS:
                view["generation"] = generations.get(view["run_id"])
                view["initial_system"] = systems.get(view["run_id"])
        return views

    # -- operator plumbing -------------------------------------------------------------

    def _operator(self, identity: Identity) -> None:
        if not identity.operator:
            raise PermissionDenied("operators only")

    def _operator_key(self) -> str:
        """The gym's own root key that scoring and validation are billed to (created once)."""
        with self.store.transaction() as s:
            found = s.execute(select(ApiKey.id, ApiKey.policy).where(
                ApiKey.name == OPERATOR_KEY_NAME, ApiKey.parent_id.is_(None), ApiKey.track.is_(None))).first()
        policy = Policy.model_validate({"services": {
            "sandbox": {"door": True, "internet": False}, "inference": {"models": "*", "cross_run": True},
            "rollout": {"models": "*"}}})  # rollout: judged benchmarks' judges (services/evaluation/jobs.py)
        if found is not None:
            kept = Policy.model_validate(found[1])
            if kept.service("rollout") is None:  # a key made before judged benchmarks: it pays for judges now
                kept.services["rollout"] = policy.services["rollout"]
                self.keys.set_policy(found[0], kept)
            return str(found[0])
        view, _ = self.keys.create(policy=policy, budget_nusd=usd_to_nusd(OPERATOR_BUDGET_USD), track=None,
                                   name=OPERATOR_KEY_NAME)
        return view["id"]

    def shutdown(self) -> None:
        self.runner.shutdown()
        self.integrity.shutdown()


def submission_view(r: SubmissionRow) -> dict[str, Any]:
    return {"id": r.id, "object": "submission", "run_id": r.run_id, "track": r.track, "checkpoint": r.checkpoint_id,
            "model": r.model, "harness": r.harness, "created_at": r.created_at.isoformat()}


def generation_view(g: RunGeneration | None) -> dict[str, Any] | None:
    """A run's place in its chain (None: generation 1, started from the base model)."""
    if g is None:
        return None
    return {"generation": g.generation, "from_run_id": g.from_run_id, "chain_root_id": g.chain_root_id,
            "submission_id": g.submission_id, "initial_model": g.initial_model, "initial_harness": g.initial_harness,
            "initial_weights_hash": g.initial_weights_hash, "base_model": g.base_model}


def score_view(r: ScoreRow) -> dict[str, Any]:
    return {"id": r.id, "object": "score", "run_id": r.run_id, "agent": r.agent, "submission_id": r.submission_id,
            "benchmark": r.benchmark, "split": r.split, "model": r.model, "harness": r.harness,
            "attempts": r.attempts, "subset": r.subset, "subset_seed": r.subset_seed, "split_seed": r.split_seed,
            "job_id": r.job_id, "score": r.score, "status": r.status, "cell": r.cell,
            "created_at": r.created_at.isoformat() if r.created_at else None}

