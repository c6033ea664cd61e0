"""Registered benchmarks: validated once, by running every task's oracle and a do-nothing
agent in the local environment, before any evaluation may use them.

Registration checks the layout at once (every task parses with Harbor's own TaskConfig),
keeps its own copy under the data dir (a tarball is unpacked there), and queues a
validation job; the benchmark becomes ``ready`` only when every oracle solution scored 1
and every empty answer scored 0, and ``refused`` (with the failing tasks) otherwise.

A generated split (``[splits.official] generator = …``) is drawn into the staged copy before those
checks, from the gym's seed or the operator's ``seed_file`` (services/evaluation/official_splits.py),
so the split is validated, disjointness-checked and registered like a shipped one, but no file of the
benchmark's source holds it.

A benchmark's training pool (services/evaluation/benchmarks.py) is checked at registration with the
contamination audit's own scanner and settings: a pool row that the audit would match to any task
of the benchmark refuses the registration, naming the rows, so an agent that trains on the pool is
never flagged for it.

A judged benchmark's ``[judge] model`` must be a model of the gym's rollout catalogue: a judge the
gym cannot serve would fail every verifier, so registration refuses it at once (422).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select

from kit.config import AuditConfig, RolloutConfig
from kit.errors import Conflict, NotFound, Unprocessable
from kit.private_files import lock_down, private_dir
from services.evaluation import templates
from services.evaluation.benchmarks import Benchmark, load_benchmark, pool_questions, validate_structure
from services.evaluation.official_splits import (
    Seed,
    check_generated_disjoint,
    generate_splits,
    gym_seed,
    operator_seed,
)
from services.evaluation.tables import BenchmarkRow, TrialResultRow
from services.records.audits.contamination import scan, task_items
from storage.store import Store


def benchmark_view(row: BenchmarkRow, *, operator: bool) -> dict[str, Any]:
    splits = {name: info for name, info in row.splits.items() if operator or not info.get("hidden")}
    pool = row.training_pool
    return {"name": row.name, "object": "benchmark", "version": row.version, "description": row.description,
            "splits": splits, "status": row.validation.get("status"),
            "training_pool": {"rows": pool["rows"], "sha256": pool["sha256"]} if pool else None,
            **({"validation": row.validation} if operator else {})}


def check_pool_disjoint(bench: Benchmark, audit: AuditConfig) -> int:
    """Rows in the pool; ``ValueError`` naming the rows the contamination scanner (with the gym's
    audit settings) matches to a task of ``bench``."""
    questions = pool_questions(bench)
    if not questions:
        return 0
    report = scan((("pool", n, q) for n, q in enumerate(questions, start=1)), task_items(bench), audit.ngram,
                  audit.contamination_threshold, min_item_words=audit.min_item_words)
    hit = report.contaminated
    if hit:
        quoted = "; ".join(f"row {m.row} \"{m.training_excerpt}\" ~ {m.task} ({m.split})"
                           for t in hit[:5] for m in report.matches_of(t)[:1])
        raise ValueError(f"training pool {bench.training_pool}: {len(hit)} task(s) would be flagged as contaminated "
                         f"by training on it: {quoted}")
    return len(questions)


def check_judge(bench: Benchmark, rollout: RolloutConfig | None) -> None:
    """``ValueError`` when the benchmark declares a judge the gym's rollout catalogue lacks."""
    if bench.judge is None:
        return
    names = [m.name for m in rollout.models] if rollout is not None else []
    if bench.judge.model not in names:
        raise ValueError(f"[judge] model {bench.judge.model!r} is not in the gym's rollout catalogue "
                         f"({', '.join(names) or 'empty'}): a judged benchmark's verifiers ask a catalogue model")


def _pool_info(bench: Benchmark) -> dict[str, Any] | None:
    if bench.training_pool is None:
        return None
    path = bench.root / bench.training_pool
    return {"path": bench.training_pool, "rows": len(pool_questions(bench)),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


class BenchmarkRegistry:
    def __init__(self, store: Store, root: Path, audit: AuditConfig | None = None,
                 rollout: RolloutConfig | None = None):
        self.store, self.root = store, root
        self.audit = audit or AuditConfig()
        self.rollout = rollout
        """The rollout catalogue a judged benchmark's judge must be in (None: no judge is accepted)."""
        private_dir(self.root)
        self._cache: dict[str, Benchmark] = {}
        self._lock = threading.Lock()

    def register(self, source: str | Path, *, replace: bool = False,
                 seed_file: str | Path | None = None) -> tuple[BenchmarkRow, Benchmark]:
        """Check and copy a benchmark, drawing its generated splits (from ``seed_file`` on the gym's
        host, else the gym's own seed); the caller queues its validation job."""
        source = Path(source)
        if not source.exists():
            raise NotFound(f"no benchmark at {source} on the gym's host", param="path")
        try:
            seed: Seed | None = operator_seed(seed_file) if seed_file is not None else None
        except ValueError as err:
            raise Unprocessable(f"benchmark refused: {err}", param="seed_file") from err
        staging = Path(tempfile.mkdtemp(prefix=".register-", dir=self.root))
        try:
            try:
                bench = load_benchmark(source, extract_to=staging / "unpacked")
                validate_structure(bench)
                check_judge(bench, self.rollout)
            except ValueError as err:
                raise Unprocessable(f"benchmark refused: {err}", param="path") from err
            dest = self.root / f"{bench.name}-{bench.version}"
            with self.store.transaction() as s:
                existing = s.get(BenchmarkRow, bench.name)
                if existing is not None and not replace:
                    raise Conflict(f"benchmark {bench.name!r} is already registered (version {existing.version})",
                                   param="path")
            tree = staging / "tree"
            shutil.copytree(bench.root, tree, symlinks=False)
            try:
                generated: dict[str, dict[str, Any]] = {}
                if any(split.generated for split in bench.splits.values()):
                    generated = generate_splits(tree, seed or gym_seed(self.root))
                    bench = load_benchmark(tree)
                    validate_structure(bench)
                    check_generated_disjoint(bench)
                check_pool_disjoint(bench, self.audit)
            except ValueError as err:
                raise Unprocessable(f"benchmark refused: {err}", param="path") from err
            if dest.exists():
                shutil.rmtree(dest)
            tree.rename(dest)
            lock_down(dest)  # the copy took the source's modes: hidden tests are the gym's alone
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        bench = load_benchmark(dest)
        row = BenchmarkRow(
            name=bench.name, version=bench.version, description=bench.description, path=str(dest),
            splits={n: {"hidden": sp.hidden, "tasks": len(sp.tasks),
                        **({"generated": generated[n]} if n in generated else {})} for n, sp in bench.splits.items()},
            validation={"status": "validating"}, training_pool=_pool_info(bench))
        with self.store.transaction() as s:
            s.merge(row)
        with self._lock:
            self._cache.pop(bench.name, None)
        return row, bench

    def pool_path(self, name: str) -> Path:
        """The registered copy of ``name``'s training pool; NotFound when it has none."""
        row = self.get(name)
        if not row.training_pool:
            raise NotFound(f"benchmark {name!r} has no training pool", param="benchmark")
        return Path(row.path) / row.training_pool["path"]

    def set_validation_job(self, name: str, job_id: str) -> None:
        with self.store.transaction() as s:
            row = s.get(BenchmarkRow, name)
            if row is None:
                raise NotFound(f"benchmark {name!r} not found", param="benchmark")
            row.validation = {"status": "validating", "job_id": job_id}

    def finish_validation(self, job_id: str) -> None:
        with self.store.transaction() as s:
            row = next((r for r in s.scalars(select(BenchmarkRow)) if r.validation.get("job_id") == job_id), None)
            if row is None:
                return
            results = s.scalars(select(TrialResultRow).where(TrialResultRow.job_id == job_id)).all()
            oracle = {r.task_id: r for r in results if r.attempt == 1}
            empty = {r.task_id: r for r in results if r.attempt == 2}
            total = sum(info["tasks"] for info in row.splits.values())
            unbuilt = templates.load(Path(row.path)).failed  # a task's Dockerfile that could not be built
            bad_oracle = sorted(t for t, r in oracle.items() if r.reward != 1.0)
            bad_empty = sorted(t for t, r in empty.items() if r.reward not in (0.0, None) or r.error)
            complete = len(oracle) == total and len(empty) == total
            status = "ready" if complete and not bad_oracle and not bad_empty else "refused"
            row.validation = {
                "status": status, "job_id": job_id, "tasks": total, "oracle_scored_1": total - len(bad_oracle)
                if complete else len(oracle) - len(bad_oracle), "empty_scored_0": len(empty) - len(bad_empty),
                "oracle_failures": bad_oracle[:50], "empty_failures": bad_empty[:50],
                **({"build_failures": dict(list(unbuilt.items())[:50])} if unbuilt else {}),
                **({} if complete else {"error": "validation did not run every task"}),
            }

    def get(self, name: str) -> BenchmarkRow:
        with self.store.transaction() as s:
            row = s.get(BenchmarkRow, name)
            if row is None:
                raise NotFound(f"benchmark {name!r} not found", param="benchmark")
            s.expunge(row)
            return row

    def list(self) -> list[BenchmarkRow]:
        with self.store.transaction() as s:
            rows = list(s.scalars(select(BenchmarkRow).order_by(BenchmarkRow.name)))
            for r in rows:
                s.expunge(r)
            return rows

    def load(self, name: str) -> Benchmark:
        row = self.get(name)
        with self._lock:
            bench = self._cache.get(name)
            if bench is None or str(bench.root) != row.path:
                bench = self._cache[name] = load_benchmark(row.path)
            return bench
