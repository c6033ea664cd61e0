"""``arithmetic``: "What is A - B?" with two-digit A > B (4,005 questions), the answer in
/app/answer.txt. The tiny base model only understands that exact shape."""

from __future__ import annotations

import random

from services.evaluation.task_generators.rendering import TaskSpec, answer_check

PAIRS = [(a, b) for a in range(10, 100) for b in range(10, a)]


def task(a: int, b: int) -> TaskSpec:
    answer = str(a - b)
    return TaskSpec(
        instruction=f"What is {a} - {b}?\n",
        check=answer_check(answer),
        solve=f"echo {answer} > /app/answer.txt\n",
        summary=f"{a} - {b} = {answer}",
        metadata={"kind": "qa", "answer_file": "/app/answer.txt"},
    )


def public_tasks(rng: random.Random, n: int) -> list[TaskSpec]:
    """The repository's draw: ``n`` distinct questions at once."""
    return [task(a, b) for a, b in rng.sample(PAIRS, n)]


def draw(rng: random.Random, index: int) -> TaskSpec:
    """One question, uniform over the space (the caller rejects the ones it must not use)."""
    return task(*rng.choice(PAIRS))


def pool(rng: random.Random, tasks: list[TaskSpec], rows: int) -> list[str]:
    """``rows`` questions of the benchmark's form that no task of ``tasks`` asks."""
    asked = {spec.instruction.strip() for spec in tasks}
    free = [q for q in (f"What is {a} - {b}?" for a, b in PAIRS) if q not in asked]
    return rng.sample(free, rows)
