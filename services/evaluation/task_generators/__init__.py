"""Task generators: draw Harbor tasks of one benchmark's distribution from a seeded RNG.

The same generator serves twice:

* the repository's **public draw** (:func:`public_draw`, written out by benchmarks/generate.py): a
  fixed, published seed gives the dev split and the training pool, which anyone may read;
* the gym's **generated split** (services/evaluation/official_splits.py): at registration, a seed the
  operator holds draws a benchmark's official tasks into the gym's private data dir, rejecting every
  question the public draw ever made, so no file an agent can read holds one of them.

The public draw's tasks are ``PUBLIC_TASKS`` long: the dev split is its first ``PER_SPLIT``; the rest
are **retired**, the official split that the repository committed up to version 1.0.0 of the bundled
benchmarks. They are still in its git history, so they are drawn (to keep the dev split and the pool
as they were) and then kept out of every generated split, never written again.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from services.evaluation.task_generators import arithmetic, shell
from services.evaluation.task_generators.rendering import TaskSpec, question_key, render_task

SEED = 20250611
"""The public draw's seed: published with the generator, so it must never seed anything hidden."""
PER_SPLIT = 60
PUBLIC_TASKS = 2 * PER_SPLIT
POOL_ROWS = 2000
"""Questions in a training pool: about half the questions no public task asks, so the pool does
not spell out the rest of the space as its complement."""


@dataclass(frozen=True)
class TaskGenerator:
    name: str
    id_prefix: str
    """Task ids are ``<prefix>-0001``, … (unique across a benchmark's splits)."""
    description: str
    public_tasks: Callable[[random.Random, int], list[TaskSpec]]
    draw: Callable[[random.Random, int], TaskSpec]
    """``draw(rng, index)``: the ``index``-th task of a split (of the distribution the public tasks
    come from); the caller rejects questions it must not use and draws again at the same index."""
    pool: Callable[[random.Random, list[TaskSpec], int], list[str]] | None = None


@dataclass(frozen=True)
class PublicDraw:
    """What the repository publishes or once published of a generator's benchmark."""

    dev: list[TaskSpec]
    retired: list[TaskSpec]
    pool: list[str]

    def question_keys(self) -> set[str]:
        return ({spec.question_key() for spec in (*self.dev, *self.retired)}
                | {question_key(question, {}) for question in self.pool})


GENERATORS: dict[str, TaskGenerator] = {
    "arithmetic": TaskGenerator(
        "arithmetic", "sub", "Two-digit subtraction questions (a - b with a > b); answer in /app/answer.txt.",
        arithmetic.public_tasks, arithmetic.draw, arithmetic.pool),
    "shell": TaskGenerator(
        "shell", "sh", "File and text-processing tasks solved with standard shell tools in /app.",
        shell.public_tasks, shell.draw),
}


def generator(name: str) -> TaskGenerator:
    """The generator called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return GENERATORS[name]
    except KeyError:
        raise ValueError(f"unknown task generator {name!r} (known: {', '.join(sorted(GENERATORS))})") from None


@functools.cache
def public_draw(name: str) -> PublicDraw:
    """The repository's draw for the generator ``name``: a pure function of :data:`SEED`."""
    gen = generator(name)
    rng = random.Random(f"{SEED}:{name}")
    tasks = gen.public_tasks(rng, PUBLIC_TASKS)
    pool = gen.pool(rng, tasks, POOL_ROWS) if gen.pool else []  # drawn after the tasks: they do not move
    return PublicDraw(tasks[:PER_SPLIT], tasks[PER_SPLIT:], pool)


__all__ = ["GENERATORS", "PER_SPLIT", "PublicDraw", "TaskGenerator", "TaskSpec", "generator", "public_draw",
           "render_task"]
