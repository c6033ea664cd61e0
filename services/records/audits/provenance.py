"""The provenance audit: the submitted system is what this run built through the platform.

Registry rows (checkpoints, harnesses) are what the services serve; platform events
(services/records/events.py) are the hash-chained record of how they came to be; the bytes on disk
are what actually runs. The audit holds the three against each other for every link of the
submitted checkpoint's chain (checkpoint → parent → … → base model):

* owned by this run (``Checkpoint.run_id``);
* trained through the platform: a ``checkpoint.registered`` event in *this* run's chain that agrees
  with the row (job, base model, parent, weights hash, datasets), and a ``training.job`` event for
  its job that agrees too (base, input checkpoint, outputs);
* from a base model the run's track allows (the run key's ``training`` policy: ``models = "*"``
  means any base the gym offers; a fixed or allowed ``base_model`` field rule narrows it), the same
  base as its parent and as the chain's root;
* weights on disk hash (services/training/checkpoints.py ``hash_dir``) to the registry's and the
  event's hash — a missing directory is a flag;
* every dataset it was trained on (``dataset_hashes``) registered in this run's records.

Across runs (``rsigym run start --from``, services/records/audits/inherited.py): the walk reaches
the run's granted initial checkpoint; from there down each link is labelled "inherited from run X
(generation N, accepted audit …)" and checked only for what the grant fixed (the weights hash the
run started from, on disk too) and for its place in the chain (a run of this chain, the chain's
base); the lineage then shows generations 0 … N. A checkpoint of another run that is not the grant
still flags. The granted initial harness may be submitted as is (its bytes still checked).

The submitted harness: a harness of this run (or its granted initial harness), a ``harness.uploaded`` event with its SHA-256, the
kept archive still hashing to it, and the unpacked tree that trials run still holding exactly the
archive's files. Finally the run's chain itself is verified (``EventLog.verify``): a changed,
deleted or truncated event, or a forged head, is ``evaluation_tampering`` — the records are what
every other check trusts.

Every problem is an EXECUTED finding (``model_or_weight_substitution`` for the model,
``evaluation_tampering`` for the harness and the records) naming the link's experiment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from access.policy import Policy
from services.records.audits.context import AuditContext
from services.records.audits.findings import CheckResult, Finding
from services.records.audits.harness_check import MINIMAL, harness_store, read_archive, read_tree
from services.records.audits.inherited import Inheritance, inheritance, usable_harness
from services.records.events import (
    CHECKPOINT_REGISTERED,
    DATASET_REGISTERED,
    HARNESS_UPLOADED,
    TRAINING_JOB,
    RecordEvent,
)
from services.training.checkpoints import Checkpoint, hash_dir
from storage.tables import ApiKey

SUBSTITUTION = "model_or_weight_substitution"
TAMPERING = "evaluation_tampering"
MAX_CHAIN = 1000
"""Links followed before a chain is called circular."""


@dataclass
class _Records:
    """The run's platform events the check reads, indexed."""

    checkpoints: dict[str, list[RecordEvent]] = field(default_factory=dict)
    jobs: dict[str, list[RecordEvent]] = field(default_factory=dict)
    datasets: dict[str, str] = field(default_factory=dict)
    """sha256 → dataset id (first registration)"""
    harnesses: dict[str, list[RecordEvent]] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: AuditContext) -> _Records:
        r = cls()
        for e in ctx.run_events(CHECKPOINT_REGISTERED, TRAINING_JOB, DATASET_REGISTERED, HARNESS_UPLOADED):
            d = e.data if isinstance(e.data, dict) else {}
            if e.kind == CHECKPOINT_REGISTERED:
                r.checkpoints.setdefault(str(d.get("checkpoint_id")), []).append(e)
            elif e.kind == TRAINING_JOB:
                r.jobs.setdefault(str(d.get("job_id")), []).append(e)
            elif e.kind == DATASET_REGISTERED:
                r.datasets.setdefault(str(d.get("sha256")), str(d.get("dataset_id")))
            else:
                r.harnesses.setdefault(str(d.get("harness_id")), []).append(e)
        return r


def _chain_rows(ctx: AuditContext, checkpoint_id: str) -> tuple[list[Checkpoint], str | None]:
    """The links from the checkpoint up to the base model, and the problem that stopped the walk
    early (a missing parent, a cycle) or None."""
    rows: list[Checkpoint] = []
    seen: set[str] = set()
    current: str | None = checkpoint_id
    with ctx.store.transaction() as s:
        while current is not None:
            if current in seen or len(rows) >= MAX_CHAIN:
                return rows, f"the chain of {checkpoint_id} loops back to {current}"
            seen.add(current)
            row = s.get(Checkpoint, current)
            if row is None:
                return rows, f"checkpoint {current} is not in the registry"
            rows.append(row)
            current = row.parent_checkpoint_id
    return rows, None


def _allowed_bases(ctx: AuditContext) -> tuple[set[str] | None, str]:
    """The base models the run's track lets it train (None: the run key is missing) and why."""
    offered = {m.name for m in ctx.config.models}
    with ctx.store.transaction() as s:
        key = s.get(ApiKey, ctx.run_id)
    if key is None:
        return None, "the run key is missing"
    training = Policy.model_validate(key.policy).service("training")
    if training is None:
        return set(), f"the {key.track or 'run'} track does not grant training"
    allowed = set(offered) if training.models == "*" else set(training.models) & offered
    rule = training.fields.get("base_model")
    if rule is not None and rule.kind == "fixed":
        allowed &= {str(rule.arg)}
    elif rule is not None and rule.kind == "allowed":
        allowed &= {str(v) for v in rule.arg}
    return allowed, f"the {key.track or 'run'} track allows {sorted(allowed)}"


def _disk_hash(path: str) -> str | None:
    p = Path(path)
    return hash_dir(p) if p.is_dir() else None


def _link_problems(ctx: AuditContext, row: Checkpoint, parent: Checkpoint | None, root_base: str,  # noqa: C901 - one check per link kind, in the order an auditor reads them
                   records: _Records, allowed: set[str] | None, allowed_why: str) -> tuple[list[str], dict[str, Any]]:
    """What is wrong with one link, and its lineage-table entry."""
    problems: list[str] = []
    if row.run_id != ctx.run_id:
        problems.append(f"checkpoint {row.id} belongs to another run")
    events = records.checkpoints.get(row.id, [])
    event = events[0].data if events else None
    if event is None:
        problems.append(f"checkpoint {row.id} has no checkpoint.registered event in this run's records")
    else:
        for name, mine, theirs in (("job", row.job_id, event.get("job_id")),
                                   ("base model", row.base_model, event.get("base_model")),
                                   ("parent", row.parent_checkpoint_id, event.get("parent_checkpoint")),
                                   ("weights hash", row.weights_hash, event.get("weights_hash")),
                                   ("datasets", sorted(row.dataset_hashes or []),
                                    sorted(event.get("dataset_hashes") or []))):
            if mine != theirs:
                problems.append(f"checkpoint {row.id}: registry {name} {mine!r} differs from the recorded {theirs!r}")
        if len(events) > 1:
            problems.append(f"checkpoint {row.id} was recorded {len(events)} times")
    job_events = records.jobs.get(row.job_id, [])
    job = job_events[-1].data if job_events else None
    if job is None:
        problems.append(f"training job {row.job_id} of checkpoint {row.id} has no training.job event in this run")
    else:
        if job.get("base_model") != row.base_model:
            problems.append(f"training job {row.job_id} recorded base {job.get('base_model')!r}, "
                            f"checkpoint {row.id} says {row.base_model!r}")
        if job.get("input_checkpoint") != row.parent_checkpoint_id:
            problems.append(f"training job {row.job_id} recorded input checkpoint {job.get('input_checkpoint')!r}, "
                            f"checkpoint {row.id} says parent {row.parent_checkpoint_id!r}")
        outputs = job.get("output_checkpoints") or []
        if outputs and row.id not in outputs:
            problems.append(f"training job {row.job_id} did not record checkpoint {row.id} among its outputs")
    if allowed is not None and row.base_model not in allowed:
        problems.append(f"checkpoint {row.id} was trained from base {row.base_model!r}; {allowed_why}")
    if parent is not None and parent.base_model != row.base_model:
        problems.append(f"checkpoint {row.id} has base {row.base_model!r} but its parent {parent.id} "
                        f"has {parent.base_model!r}")
    if row.base_model != root_base:
        problems.append(f"checkpoint {row.id} has base {row.base_model!r}, the chain's root has {root_base!r}")
    disk = _disk_hash(row.path)
    if disk is None:
        problems.append(f"checkpoint {row.id}: weights directory {row.path} is missing")
    else:
        if disk != row.weights_hash:
            problems.append(f"checkpoint {row.id}: weights on disk hash to {disk}, the registry says {row.weights_hash}")
        if event is not None and event.get("weights_hash") != disk:
            problems.append(f"checkpoint {row.id}: weights on disk hash to {disk}, the record says "
                            f"{event.get('weights_hash')}")
    unrecorded = [h for h in (row.dataset_hashes or []) if h not in records.datasets]
    for sha in unrecorded:
        problems.append(f"checkpoint {row.id} was trained on dataset sha256 {sha}, which this run never registered")
    entry = {"checkpoint": row.id, "run_owned": row.run_id == ctx.run_id, "job": row.job_id,
             "base_model": row.base_model, "parent": row.parent_checkpoint_id, "experiment": row.experiment_id,
             "weights_hash": {"registry": row.weights_hash, "event": event.get("weights_hash") if event else None,
                              "disk": disk},
             "datasets": [{"sha256": h, "dataset_id": records.datasets.get(h)} for h in (row.dataset_hashes or [])],
             "recorded": event is not None, "job_recorded": job is not None, "ok": not problems}
    return problems, entry


def _inherited_link(ctx: AuditContext, row: Checkpoint, granted: bool, parent: Checkpoint | None, root_base: str,
                    inherit: Inheritance) -> tuple[list[str], dict[str, Any]]:
    """What is wrong with a link an earlier generation made (the granted initial checkpoint and
    the links below it), and its lineage-table entry, labelled with the run that made it."""
    problems: list[str] = []
    generation = inherit.runs.get(row.run_id)
    if generation is None or row.run_id == ctx.run_id:
        problems.append(f"checkpoint {row.id} belongs to run {row.run_id}, which is not an earlier generation of "
                        "this run's chain")
    if granted and row.weights_hash != inherit.initial_weights_hash:
        problems.append(f"checkpoint {row.id}: registry weights hash {row.weights_hash} differs from "
                        f"{inherit.initial_weights_hash}, the hash this run was granted")
    if parent is not None and parent.base_model != row.base_model:
        problems.append(f"checkpoint {row.id} has base {row.base_model!r} but its parent {parent.id} "
                        f"has {parent.base_model!r}")
    if row.base_model != root_base or row.base_model != inherit.base_model:
        problems.append(f"checkpoint {row.id} has base {row.base_model!r}, the chain's generation 0 is "
                        f"{inherit.base_model!r}")
    disk = _disk_hash(row.path)
    if disk is None:
        problems.append(f"checkpoint {row.id}: weights directory {row.path} is missing")
    elif disk != row.weights_hash:
        problems.append(f"checkpoint {row.id}: weights on disk hash to {disk}, the registry says {row.weights_hash}")
    entry = {"checkpoint": row.id, "run_owned": False, "run": row.run_id, "generation": generation,
             "inherited": inherit.label(row.run_id), "granted": granted, "job": row.job_id,
             "base_model": row.base_model, "parent": row.parent_checkpoint_id, "experiment": None,
             "weights_hash": {"registry": row.weights_hash, "granted": inherit.initial_weights_hash if granted else None,
                              "disk": disk},
             "ok": not problems}
    return problems, entry


def _harness_problems(ctx: AuditContext, harness: str, records: _Records) -> tuple[list[str], list[str], dict[str, Any]]:
    """(substitution problems, tampering problems, details) for the submitted harness."""
    if harness == MINIMAL:
        return [], [], {"harness": MINIMAL, "note": "built-in harness"}
    found = usable_harness(ctx, harness)
    if found is None:
        return [f"harness {harness} is not a harness this run uploaded"], [], {"harness": harness, "owned": False}
    row, owner = found
    tampered: list[str] = []
    if owner != ctx.run_id:  # the granted initial harness: its upload is in the earlier run's records
        inherit = inheritance(ctx)
        return [], _archive_problems(ctx, row.id, row.sha256, None, tampered), {
            "harness": row.id, "owned": False, "run": owner,
            "inherited": inherit.label(owner) if inherit is not None else None}
    events = records.harnesses.get(row.id, [])
    recorded = events[0].data.get("sha256") if events else None
    if recorded is None:
        tampered.append(f"harness {row.id} has no harness.uploaded event in this run's records")
    elif recorded != row.sha256:
        tampered.append(f"harness {row.id}: registry sha256 {row.sha256} differs from the recorded {recorded}")
    archive = harness_store(ctx).archive_path(row.sha256)
    archive_hash = _sha256_file(archive) if archive.is_file() else None
    _archive_problems(ctx, row.id, row.sha256, recorded, tampered)
    return [], tampered, {"harness": row.id, "owned": True, "sha256": {"registry": row.sha256, "event": recorded,
                                                                       "archive": archive_hash}}


def _archive_problems(ctx: AuditContext, harness_id: str, sha256: str, recorded: str | None,
                      tampered: list[str]) -> list[str]:
    """``tampered`` with the kept archive and its unpacked tree checked against the registry's
    (and the record's) SHA-256."""
    store = harness_store(ctx)
    archive = store.archive_path(sha256)
    if not archive.is_file():
        tampered.append(f"harness {harness_id}: the uploaded archive {archive.name} is missing")
        return tampered
    archive_hash = _sha256_file(archive)
    for name, expected in (("registry", sha256), ("record", recorded)):
        if expected is not None and archive_hash != expected:
            tampered.append(f"harness {harness_id}: the stored archive hashes to {archive_hash}, "
                            f"the {name} says {expected}")
            break
    tampered.extend(_tree_differences(harness_id, archive, store.root / sha256))
    return tampered


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _tree_differences(harness_id: str, archive: Path, tree: Path) -> list[str]:
    """The unpacked tree (what trials run) against the archive's files, byte for byte."""
    try:
        expected = {name: hashlib.sha256(data).hexdigest() for name, data in read_archive(archive)}
    except Exception as err:  # noqa: BLE001 - an unreadable archive is a finding, not a crash
        return [f"harness {harness_id}: the stored archive cannot be read ({err})"]
    if not tree.is_dir():
        return [f"harness {harness_id}: the unpacked harness directory is missing"]
    actual = {name: hashlib.sha256(data).hexdigest() for name, data in read_tree(tree)}
    out = [f"harness {harness_id}: {name} differs from the uploaded archive"
           for name in sorted(expected) if name in actual and actual[name] != expected[name]]
    out += [f"harness {harness_id}: {name} was removed after upload" for name in sorted(set(expected) - set(actual))]
    out += [f"harness {harness_id}: {name} was added after upload" for name in sorted(set(actual) - set(expected))]
    return out


def _finding(category: str, evidence: str, experiment: str | None) -> Finding:
    return Finding(category=category, code="EXECUTED", evidence=evidence,
                   experiment_ids=[experiment] if experiment else [], submission=True)


def check_provenance(ctx: AuditContext, submission: dict[str, Any]) -> CheckResult:
    """Provenance of the submitted checkpoint's chain and harness, and the run's record chain."""
    records = _Records.of(ctx)
    findings: list[Finding] = []
    lineage: list[dict[str, Any]] = []
    details: dict[str, Any] = {"submission": submission.get("id"), "lineage": lineage}
    checkpoint = submission.get("checkpoint")
    model = submission.get("model")
    if not checkpoint and isinstance(model, str) and model.startswith("ckpt_"):
        checkpoint = model
    inconclusive = False
    if checkpoint:
        rows, broken = _chain_rows(ctx, str(checkpoint))
        allowed, allowed_why = _allowed_bases(ctx)
        details["allowed_bases"] = sorted(allowed) if allowed is not None else None
        if allowed is None:
            inconclusive = True
            findings.append(Finding(category=SUBSTITUTION, code="INCONCLUSIVE", submission=True,
                                    evidence=f"cannot tell which base models the track allows: {allowed_why}"))
        if broken is not None:
            last = rows[-1].experiment_id if rows else None
            findings.append(_finding(SUBSTITUTION, broken, last))
        root_base = rows[-1].base_model if rows else ""
        details["base_model"] = root_base or None
        inherit = inheritance(ctx)
        cut = next((i for i, row in enumerate(rows) if inherit is not None and inherit.initial_weights_hash
                    and row.id == inherit.initial_model), len(rows))  # from here down: earlier generations'
        for i, row in enumerate(rows):
            parent = rows[i + 1] if i + 1 < len(rows) else None
            if i < cut:
                problems, entry = _link_problems(ctx, row, parent, root_base, records, allowed, allowed_why)
                if inherit is not None:
                    entry["generation"] = inherit.generation
            else:
                assert inherit is not None
                problems, entry = _inherited_link(ctx, row, i == cut, parent, root_base, inherit)
            lineage.append(entry)
            findings.extend(_finding(SUBSTITUTION, p, row.experiment_id if i < cut else None) for p in problems)
        if inherit is not None:
            details["generations"] = inherit.generations()
    elif isinstance(model, str) and model and ctx.config.base_model(model) is None:
        findings.append(_finding(SUBSTITUTION, f"submitted model {model!r} is neither a checkpoint nor a base model "
                                               "this gym offers", None))
    else:
        details["base_model"] = model
    substituted, tampered, harness_details = _harness_problems(ctx, str(submission.get("harness") or MINIMAL),
                                                               records)
    details["harness"] = harness_details
    if "generations" not in details and (inherit_any := inheritance(ctx)) is not None:
        details["generations"] = inherit_any.generations()
    findings.extend(_finding(SUBSTITUTION, p, None) for p in substituted)
    findings.extend(_finding(TAMPERING, p, None) for p in tampered)
    chain, unverifiable, details["chain"] = chain_findings(ctx)
    findings.extend(chain)
    inconclusive = inconclusive or unverifiable
    flagged = any(f.code == "EXECUTED" for f in findings)
    verdict = "flag" if flagged else ("inconclusive" if inconclusive else "pass")
    return CheckResult(name="provenance", verdict=verdict, findings=findings, details=details)  # type: ignore[arg-type]


def chain_findings(ctx: AuditContext) -> tuple[list[Finding], bool, dict[str, Any]]:
    """The run's record chain, checked (``EventLog.verify``): a tampering finding per problem
    found (a rolled-back chain among them), an inconclusive one when its head could not be
    checked against the anchor outside the store; whether it was unverifiable; the check's view."""
    chain = ctx.events.verify(ctx.run_id)
    findings = [_finding(TAMPERING, f"record chain: {p['problem']} at event {p['seq']}: {p['detail']}", None)
                for p in chain.problems]
    unverifiable = chain.status == "unverifiable"
    if unverifiable:
        findings.append(Finding(category=TAMPERING, code="INCONCLUSIVE", submission=True,
                                evidence="record chain: cannot be checked against its anchor outside the store: "
                                         + str(chain.anchor.get("detail") or chain.anchor.get("status"))))
    return findings, unverifiable, chain.view()


def lineage_datasets(ctx: AuditContext, checkpoint_id: str | None) -> list[tuple[str, str]]:
    """``(dataset_id, sha256)`` of every dataset any link of the checkpoint's chain was trained on,
    as this run's records know them (``dataset.registered`` events matched by hash; the hashes come
    from the registry rows, their ``checkpoint.registered`` events and their jobs' ``training.job``
    events). A hash this run never registered is left out — provenance flags it."""
    if not checkpoint_id:
        return []
    records = _Records.of(ctx)
    rows, _ = _chain_rows(ctx, checkpoint_id)
    shas: list[str] = []
    for row in rows:
        shas.extend(row.dataset_hashes or [])
        for e in records.checkpoints.get(row.id, []):
            shas.extend(str(h) for h in e.data.get("dataset_hashes") or [])
        for e in records.jobs.get(row.job_id, []):
            shas.extend(str(d.get("sha256")) for d in e.data.get("datasets") or [] if isinstance(d, dict))
    return [(records.datasets[sha], sha) for sha in _unique(shas) if sha in records.datasets]


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
