"""Queries over a run's platform events: experiment node views, checkpoint lineage, the diff of
two experiments and the best checkpoint (accepted or not yet audited).

Everything here is computed from the hash-chained events (services/records/events.py), never from
what the agent claims, and is free of I/O: the service loads the events a caller may read and
hands them in, in sequence order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.records.events import CHECKPOINT_REGISTERED, EVALUATION_JOB, TRAINING_JOB, RecordEvent
from services.records.experiments import Experiment, experiment_row_view

LINEAGE_KINDS = (CHECKPOINT_REGISTERED, TRAINING_JOB)
"""The events a lineage is built from."""
MAX_LINEAGE = 1000
"""Longest checkpoint chain followed (a guard against a cycle in corrupted records)."""


def latest_by_job(events: Iterable[RecordEvent], kind: str) -> list[dict[str, Any]]:
    """The last event of each job of ``kind`` (a job may be recorded more than once as its status
    changes), in order of each job's first appearance."""
    jobs: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == kind and isinstance(e.data.get("job_id"), str):
            jobs[e.data["job_id"]] = {**e.data, "experiment_id": e.experiment_id}
    return list(jobs.values())


def _datasets(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"id": d.get("id"), "sha256": d.get("sha256")} for d in data.get("datasets") or [] if isinstance(d, dict)]


def node_view(exp: Experiment, parents: list[str], events: Sequence[RecordEvent]) -> dict[str, Any]:
    """An experiment as a node (θ_in, action, θ_out, evaluations) from its attached events."""
    mine = [e for e in events if e.experiment_id == exp.id]
    trainings = latest_by_job(mine, TRAINING_JOB)
    evaluations = latest_by_job(mine, EVALUATION_JOB)
    action: list[dict[str, Any]] = []
    for t in trainings:
        action.append({"kind": "training", "job_id": t["job_id"], "status": t.get("status"),
                       "config_hash": t.get("config_hash"), "datasets": _datasets(t),
                       "base_model": t.get("base_model"), "input_checkpoint": t.get("input_checkpoint"),
                       "loss_module_hash": t.get("loss_module_hash"), "steps": t.get("steps")})
    for v in evaluations:
        action.append({"kind": "evaluation", "job_id": v["job_id"], "status": v.get("status"), "config_hash": None,
                       "datasets": []})
    checkpoints: list[str] = []
    for e in mine:
        if e.kind == CHECKPOINT_REGISTERED and isinstance(e.data.get("checkpoint_id"), str):
            checkpoints.append(e.data["checkpoint_id"])
        elif e.kind == TRAINING_JOB:
            checkpoints.extend(c for c in e.data.get("output_checkpoints") or [] if isinstance(c, str))
    model = None
    if trainings:
        model = trainings[0].get("input_checkpoint") or trainings[0].get("base_model")
    elif evaluations:
        model = evaluations[0].get("model")
    harness = next((v.get("harness") for v in evaluations if v.get("harness")), None)
    view = experiment_row_view(exp, parents)
    view.pop("run_id", None)
    return {
        **view,
        "theta_in": {"model": model, "harness": harness},
        "action": action,
        "theta_out": {"checkpoints": list(dict.fromkeys(checkpoints))},
        "evaluations": [{"job_id": v["job_id"], "status": v.get("status"), "purpose": v.get("purpose"),
                         "benchmark": v.get("benchmark"), "split": v.get("split"), "attempts": v.get("attempts"),
                         "score": v.get("score"), "model": v.get("model"), "harness": v.get("harness")}
                        for v in evaluations],
    }


# -- lineage ---------------------------------------------------------------------------------


def lineage(checkpoint_id: str, events: Sequence[RecordEvent],
            inherited: Sequence[tuple[RecordEvent, int]] = (), granted: str | None = None) -> dict[str, Any] | None:
    """The chain ``checkpoint → parent checkpoint → … → base model`` from the run's events; None
    when the run's records hold no such checkpoint.

    ``granted``: the initial checkpoint a run started with ``--from`` was granted; ``inherited``: the
    earlier runs' lineage events of its chain, each with its run's generation. From the granted
    checkpoint down (and only from there) the walk goes on through them, each such link marked
    ``inherited`` with the run and generation that made it, to the chain's base model (generation 0).
    """
    registered = {e.data["checkpoint_id"]: e for e in events
                  if e.kind == CHECKPOINT_REGISTERED and isinstance(e.data.get("checkpoint_id"), str)}
    earlier = {e.data["checkpoint_id"]: (e, g) for e, g in inherited
               if e.kind == CHECKPOINT_REGISTERED and isinstance(e.data.get("checkpoint_id"), str)}
    if checkpoint_id not in registered and checkpoint_id != granted:
        return None
    jobs = {t["job_id"]: t for t in latest_by_job(events, TRAINING_JOB)}
    jobs.update({t["job_id"]: t for t in latest_by_job([e for e, _ in inherited], TRAINING_JOB)})
    links: list[dict[str, Any]] = []
    current: str | None = checkpoint_id
    base_model = None
    seen: set[str] = set()
    crossed = False  # past the granted checkpoint: the earlier generations' records
    while current is not None and current not in seen and len(links) < MAX_LINEAGE:
        seen.add(current)
        crossed = crossed or current == granted
        event, generation = registered.get(current), None
        if event is None and crossed and current in earlier:
            event, generation = earlier[current]
        if event is None:  # a parent the run's records do not hold: the chain is broken here
            links.append({"checkpoint": current, "missing": True})
            break
        data = event.data
        job = jobs.get(str(data.get("job_id")), {})
        datasets = _datasets(job) or [{"id": None, "sha256": h} for h in data.get("dataset_hashes") or []]
        link = {"checkpoint": current, "job_id": data.get("job_id"), "base_model": data.get("base_model"),
                "parent_checkpoint": data.get("parent_checkpoint"), "step": data.get("step"),
                "config_hash": data.get("config_hash") or job.get("config_hash"), "datasets": datasets,
                "loss_module_hash": job.get("loss_module_hash"), "weights_hash": data.get("weights_hash"),
                "experiment_id": event.experiment_id if generation is None else None}
        if generation is not None:
            link["inherited"] = {"run_id": event.run_id, "generation": generation}
        links.append(link)
        base_model = data.get("base_model")
        parent = data.get("parent_checkpoint")
        current = parent if isinstance(parent, str) else None
    return {"object": "lineage", "checkpoint": checkpoint_id, "base_model": base_model, "links": links,
            "complete": not any(link.get("missing") for link in links)}


# -- diff --------------------------------------------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value} if prefix else {}


def _scores(view: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """(benchmark, split) → the score of the experiment's latest finished evaluation of it."""
    out: dict[tuple[str, str], float] = {}
    for v in view["evaluations"]:
        if v.get("score") is not None and v.get("status") in (None, "succeeded"):
            out[(str(v.get("benchmark")), str(v.get("split")))] = float(v["score"])
    return out


def diff(a: Mapping[str, Any], b: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Two node views compared: config (hashes, and the fields that differ between each one's
    last training job config, from ``configs``: job id → config), data (datasets by sha256)
    and scores (per benchmark and split, ``delta`` = b − a)."""

    def trainings(view: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return [x for x in view["action"] if x["kind"] == "training"]

    ta, tb = trainings(a), trainings(b)
    ca = _flatten(dict(configs.get(ta[-1]["job_id"], {}))) if ta else {}
    cb = _flatten(dict(configs.get(tb[-1]["job_id"], {}))) if tb else {}
    fields = [{"field": k, "a": ca.get(k), "b": cb.get(k)} for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    hashes_a = [x["config_hash"] for x in ta]
    hashes_b = [x["config_hash"] for x in tb]

    def data(view_trainings: list[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        return {d["sha256"]: d for x in view_trainings for d in x["datasets"] if d.get("sha256")}

    da, db = data(ta), data(tb)
    sa, sb = _scores(a), _scores(b)
    scores = []
    for key in sorted(set(sa) | set(sb)):
        va, vb = sa.get(key), sb.get(key)
        scores.append({"benchmark": key[0], "split": key[1], "a": va, "b": vb,
                       "delta": None if va is None or vb is None else vb - va})
    return {
        "object": "experiment.diff", "a": a["id"], "b": b["id"],
        "config": {"a": hashes_a, "b": hashes_b, "same": hashes_a == hashes_b and not fields, "fields": fields},
        "data": {"added": [db[h] for h in db if h not in da], "removed": [da[h] for h in da if h not in db],
                 "common": [db[h] for h in db if h in da]},
        "scores": scores,
    }


# -- best checkpoint ----------------------------------------------------------------------------


UNAUDITED = "unaudited"
"""How a checkpoint ranked from a ``pending`` experiment's evaluations is marked."""


def best_checkpoint(views: Iterable[Mapping[str, Any]], checkpoints: set[str], *, benchmark: str | None,
                    split: str, audited_only: bool = False) -> dict[str, Any] | None:
    """The checkpoint with the highest score on ``split`` among ``accepted`` experiments and, unless
    ``audited_only``, ``pending`` ones (during the run nothing is audited yet); never ``flagged`` ones.

    Only evaluations of the run's own checkpoints count (``checkpoints``: the ids its records
    registered), so the ranking is built from the run's own evaluations alone — what its keys
    already read, never an official score or a live integrity check. With a ``benchmark`` the
    score is that benchmark's best; without, a checkpoint's score is the mean over the benchmarks
    it was evaluated on of its best score on each. ``audit``: ``accepted`` when every evaluation
    counted comes from accepted experiments, else ``unaudited``."""
    allowed = ("accepted",) if audited_only else ("accepted", "pending")
    best: dict[str, dict[str, tuple[float, str, str]]] = {}  # ckpt → benchmark → (score, experiment, job)
    status_of: dict[str, str] = {}
    for view in views:
        if view["status"] not in allowed:
            continue
        status_of[view["id"]] = view["status"]
        for v in view["evaluations"]:
            model, score = v.get("model"), v.get("score")
            if model not in checkpoints or score is None or v.get("split") != split:
                continue
            if v.get("status") not in (None, "succeeded") or (benchmark is not None and v.get("benchmark") != benchmark):
                continue
            per = best.setdefault(model, {})
            name = str(v.get("benchmark"))
            if name not in per or float(score) > per[name][0]:
                per[name] = (float(score), view["id"], v["job_id"])
    if not best:
        return None

    def rank(item: tuple[str, dict[str, tuple[float, str, str]]]) -> tuple[float, str]:
        ckpt, per = item
        return sum(s for s, _, _ in per.values()) / len(per), ckpt

    ckpt, per = max(best.items(), key=rank)
    top = max(per.values())
    audited = all(status_of.get(exp) == "accepted" for _, exp, _ in per.values())
    return {"object": "best_checkpoint", "checkpoint": ckpt, "split": split, "benchmark": benchmark,
            "score": rank((ckpt, per))[0], "experiment_id": top[1], "evaluation_job_id": top[2],
            "scores": {name: s for name, (s, _, _) in sorted(per.items())},
            "audit": "accepted" if audited else UNAUDITED}
