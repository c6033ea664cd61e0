"""Where a run's gain came from: the 2×2 of model × harness (``rsigym score RUN --decompose``).

A joint submission changes the weights and the harness at once, so its gain over the initial
system (base model × minimal harness) does not say which did the work. ``--decompose`` scores the
two mixed systems as well, on exactly the scope of the run's score (benchmark, split, split seed,
subset and its seed, attempts), and the four cells give

* the weights' contribution: the mean over the two harnesses of (submitted model − base model),
  ``½[(model − initial) + (submitted − harness)]``;
* the harness's contribution likewise, ``½[(harness − initial) + (submitted − model)]``;
* the interaction, ``(submitted − harness) − (model − initial)``: how much the new weights gain
  more (or less) with the new harness than with the minimal one.

Weights + harness = the whole gain (submitted − initial); the interaction is reported beside them,
not added. Each comes with a 95 % paired bootstrap interval over tasks: every cell ran the same
tasks, so one resample of tasks is applied to all four (a task's value is the mean of its
attempts), and ``within_noise`` is true when 0 is inside the interval.

Cells are score rows of the run (its submission, its agent) that name their ``cell``: ``model``
(submitted model × minimal harness) and ``harness`` (base model × submitted harness); the base
cell is the ``initial`` baseline and the last cell the run's own score (services/evaluation/tables.py,
migration 0024). A submission that keeps the base model (harness track, or no checkpoint) or the
minimal harness (data track, or no harness) has a trivial decomposition: no cell is scored and the
output says so, the kept part's contribution exactly 0.

Light: plain data in, plain data out (the CLI and the report call it with the admin API's score
records and trial results); the resampling is services/evaluation/bootstrap.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from services.evaluation.bootstrap import RESAMPLES, SEED, method_note, paired_bootstrap
from services.evaluation.failures import RETRIED, failure_kind
from services.evaluation.schemas import INITIAL_RUN, MINIMAL

CELL_MODEL = "model"
"""The submitted model with the minimal harness."""
CELL_HARNESS = "harness"
"""The base model with the submitted harness."""
CELLS = (CELL_MODEL, CELL_HARNESS)
METHOD = method_note(paired=True) + "; one draw of tasks for all four cells; within_noise: 0 is in the interval"

TRIVIAL_MODEL = ("the submission keeps the base model (harness track, or no checkpoint submitted): the weights "
                 "contribute nothing by construction and the whole gain is the harness's; no cell was scored")
TRIVIAL_HARNESS = ("the submission keeps the minimal harness (data track, or no harness submitted): the harness "
                   "contributes nothing by construction and the whole gain is the weights'; no cell was scored")
TRIVIAL_BOTH = "the submission is the initial system: nothing to decompose"


def trivial_reason(model: str, harness: str, base_model: str) -> str | None:
    """Why a submission's decomposition is trivial (it kept the base model or the minimal
    harness), or None when the two mixed cells are worth scoring."""
    if model == base_model and harness == MINIMAL:
        return TRIVIAL_BOTH
    if model == base_model:
        return TRIVIAL_MODEL
    if harness == MINIMAL:
        return TRIVIAL_HARNESS
    return None


def cell_plans(model: str, harness: str, base_model: str) -> list[tuple[str, str, str]]:
    """(cell, model, harness) of the mixed systems to score for a submission; none when trivial."""
    if trivial_reason(model, harness, base_model) is not None:
        return []
    return [(CELL_MODEL, model, MINIMAL), (CELL_HARNESS, base_model, harness)]


# -- the interval ----------------------------------------------------------------------------


def comparison(per_task_a: Sequence[float], per_task_b: Sequence[float], seed: int = SEED) -> dict[str, Any]:
    """``{"estimate": mean(a − b), "ci95": [low, high], "within_noise": 0 in the interval}``: ``a[i]``
    and ``b[i]`` are one task's values (a mix of cells) and the paired bootstrap over tasks of
    services/evaluation/bootstrap.py draws each task's pair together."""
    if len(per_task_a) != len(per_task_b) or not len(per_task_a):
        raise ValueError("a comparison needs two equally long, non-empty sequences of per-task values")
    tasks = [f"{i:06d}" for i in range(len(per_task_a))]
    c = paired_bootstrap({t: [float(v)] for t, v in zip(tasks, per_task_b, strict=True)},
                         {t: [float(v)] for t, v in zip(tasks, per_task_a, strict=True)}, seed=seed)
    return {"estimate": c.diff, "ci95": list(c.ci95), "within_noise": c.within_noise}


def _exact_zero() -> dict[str, Any]:
    return {"estimate": 0.0, "ci95": [0.0, 0.0], "within_noise": True, "by_construction": True}


def per_task_means(results: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each task's mean reward over its attempts, from a job's trial results (the admin API's
    ``/evaluation/jobs/{id}/results``). An agent's failure is its 0 (as avg@k scores it); a
    platform or verifier failure is nobody's score and leaves the task out."""
    rewards: dict[str, list[float]] = {}
    skipped: set[str] = set()
    for r in results:
        kind = r.get("failure_kind") or failure_kind(r.get("reward"), r.get("error"), None)
        if kind in RETRIED:
            skipped.add(r["task_id"])
            continue
        rewards.setdefault(r["task_id"], []).append(float(r.get("reward") or 0.0))
    return {task: sum(v) / len(v) for task, v in rewards.items() if v and task not in skipped}


def decompose(initial: Mapping[str, float], model: Mapping[str, float], harness: Mapping[str, float],
              submitted: Mapping[str, float], seed: int = SEED) -> dict[str, Any]:
    """The gain and the weights', the harness's and the interaction's contributions, each with its
    paired interval, from the four cells' per-task values (task → mean reward); only tasks every
    cell has count."""
    tasks = sorted(set(initial) & set(model) & set(harness) & set(submitted))
    if not tasks:
        raise ValueError("the four cells share no task")
    i, m, h, s = (np.array([cell[t] for t in tasks]) for cell in (initial, model, harness, submitted))
    return {
        "tasks": len(tasks),
        "gain": comparison(s.tolist(), i.tolist(), seed),
        "contributions": {
            "weights": comparison(((m + s) / 2).tolist(), ((i + h) / 2).tolist(), seed),
            "harness": comparison(((h + s) / 2).tolist(), ((i + m) / 2).tolist(), seed),
            "interaction": comparison((s + i).tolist(), (h + m).tolist(), seed),
        },
    }


# -- from the admin API's score records ------------------------------------------------------

_SCOPE = ("benchmark", "split", "attempts", "subset", "subset_seed", "split_seed")


def _scope(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(record.get(k) for k in _SCOPE)


def _newest(records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(records, key=lambda r: r.get("created_at") or "", default=None)


def _cell_view(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": record["model"], "harness": record["harness"], "score": record.get("score"),
            "status": record.get("status"), "score_id": record["id"], "job_id": record["job_id"]}


def decomposition_view(scores: Sequence[Mapping[str, Any]], run_id: str,
                       results: Callable[[str], list[dict[str, Any]]], *, split: str = "official",
                       seed: int = SEED, include_trivial: bool = True) -> list[dict[str, Any]]:
    """The run's decomposition on each benchmark of ``split`` where one exists, from the admin
    API's score records (``GET /admin/v1/scores``) and a job's trial results (``results(job_id)``).

    Per benchmark: the run's newest succeeded score (not a cell) on ``split``, the ``initial``
    baseline on its scope (of the base model, where the ``harness`` cell names it), and the run's
    ``model`` and ``harness`` cells of that submission on that scope. ``status`` is ``complete``
    (the four cells and the contributions with their intervals), ``trivial`` (the submission kept
    the base model or the minimal harness: the kept part's contribution is exactly 0 and the
    other's is the gain with its interval) or ``incomplete`` (a cell missing or not succeeded:
    the cells as they are, no contribution). A benchmark without a run score or an initial score
    on its scope, or never decomposed (no cell and not trivial), is left out; so is a trivial one
    unless ``include_trivial`` (the report leaves them out: every harness- or data-track run has one)."""
    ok = [r for r in scores if r.get("split") == split and r.get("status") == "succeeded" and r.get("score") is not None]
    latest: dict[str, Mapping[str, Any]] = {}
    for r in ok:
        if r["run_id"] == run_id and not r.get("cell"):
            current = latest.get(r["benchmark"])
            if current is None or (r.get("created_at") or "") >= (current.get("created_at") or ""):
                latest[r["benchmark"]] = r
    views = []
    for benchmark, sub in sorted(latest.items()):
        scope = _scope(sub)
        cells = {name: _newest(r for r in scores if r["run_id"] == run_id and r.get("cell") == name
                               and _scope(r) == scope and r.get("submission_id") == sub.get("submission_id"))
                 for name in CELLS}
        harness_cell = cells[CELL_HARNESS]
        base_model = harness_cell["model"] if harness_cell is not None else None
        same = [r for r in ok if r["run_id"] == INITIAL_RUN and _scope(r) == scope  # base × minimal, not a
                and (r.get("harness") or MINIMAL) == MINIMAL]  # later generation's initial system
        initial = _newest(r for r in same if r["model"] in (base_model, sub["model"])) or _newest(same)
        if initial is None:
            continue
        reason = trivial_reason(sub["model"], sub["harness"], initial["model"])
        if (reason is None and not any(cells.values())) or (reason is not None and not include_trivial):
            continue  # scored without --decompose, or trivial and not asked for
        view: dict[str, Any] = {
            "benchmark": benchmark, "split": split, "attempts": sub.get("attempts"), "subset": sub.get("subset"),
            "subset_seed": sub.get("subset_seed"), "split_seed": sub.get("split_seed"),
            "submission_id": sub.get("submission_id"), "seed": seed, "resamples": RESAMPLES, "method": METHOD,
            "note": reason,
            "cells": {"initial": _cell_view(initial), **{n: _cell_view(c) for n, c in cells.items() if c},
                      "submitted": _cell_view(sub)},
        }
        if reason is not None:
            i, s = per_task_means(results(initial["job_id"])), per_task_means(results(sub["job_id"]))
            tasks = sorted(set(i) & set(s))
            gain = comparison([s[t] for t in tasks], [i[t] for t in tasks], seed) if tasks else None
            kept_model = reason in (TRIVIAL_MODEL, TRIVIAL_BOTH)
            kept_harness = reason in (TRIVIAL_HARNESS, TRIVIAL_BOTH)
            view.update(status="trivial", tasks=len(tasks), gain=gain, contributions={
                "weights": _exact_zero() if kept_model else gain,
                "harness": _exact_zero() if kept_harness else gain,
                "interaction": _exact_zero()})
        elif all(c is not None and c.get("status") == "succeeded" and c.get("score") is not None
                 for c in cells.values()):
            cell_model, cell_harness = cells[CELL_MODEL], cells[CELL_HARNESS]
            assert cell_model is not None and cell_harness is not None
            view.update(status="complete", **decompose(
                per_task_means(results(initial["job_id"])), per_task_means(results(cell_model["job_id"])),
                per_task_means(results(cell_harness["job_id"])), per_task_means(results(sub["job_id"])), seed))
        else:
            view.update(status="incomplete", tasks=None, gain=None, contributions=None,
                        note="a decomposition cell is missing or did not succeed: "
                             "`rsigym score RUN --decompose --wait` again")
        views.append(view)
    return views


def decompositions_of(scores: Sequence[Mapping[str, Any]], run_ids: Iterable[str],
                      results: Callable[[str], list[dict[str, Any]]], *, split: str = "official",
                      seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    """run → its scored (not trivial) decompositions, for the runs that have one (``rsigym report``)."""
    views = {run: decomposition_view(scores, run, results, split=split, seed=seed, include_trivial=False)
             for run in run_ids}
    return {run: v for run, v in views.items() if v}
