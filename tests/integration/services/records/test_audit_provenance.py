"""The provenance audit on real stores (SQLite and PostgreSQL).

Rows and events are written the way the platform writes them — ``CheckpointRegistry.save`` with
the run's ``EventLog`` (row and ``checkpoint.registered`` in one transaction), ``training.job`` and
``dataset.registered`` events, ``HarnessStore.upload`` — and then tampered with the way an attacker
with access to the store or the data directory would: rows edited, weights overwritten, the
harness archive replaced, events changed, deleted or cut off. Each must flag, naming the link.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, update

from access.keys import KeyRegistry
from access.presets import preset_policy
from kit.config import BaseModel_, GymConfig
from kit.ids import new_id
from services.evaluation.archives import build_archive
from services.evaluation.harnesses import HarnessStore
from services.records.audits.context import AuditContext
from services.records.audits.findings import CheckResult
from services.records.audits.provenance import check_provenance, lineage_datasets
from services.records.events import DATASET_REGISTERED, TRAINING_JOB, EventLog, RecordEvent, RecordHead
from services.training.checkpoints import Checkpoint, CheckpointRegistry
from services.training.tables import TrainingJob
from storage.store import Store

SECRET = "internal-secret-for-tests"
PRICES = {"train_usd_per_mtok": 1.0, "prefill_usd_per_mtok": 0.1, "sample_usd_per_mtok": 0.2}
CONFIG = GymConfig(models=[BaseModel_(name="tiny", **PRICES), BaseModel_(name="other", **PRICES)])


class Adapter:
    """Stands in for a PEFT model: ``save_pretrained`` writes the weights file."""

    def __init__(self, blob: bytes):
        self.blob = blob

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(self.blob)
        (Path(path) / "adapter_config.json").write_text('{"r": 16}')


@dataclass
class Platform:
    store: Store
    data_dir: Path
    events: EventLog
    registry: CheckpointRegistry

    def run_key(self, track: str = "joint", bases: list[str] | None = None) -> str:
        policy = preset_policy(track, CONFIG)
        if bases is not None and "training" in policy.services:
            policy.services["training"].models = bases
        view, _ = KeyRegistry(self.store).create(policy=policy, budget_nusd=10**12, track=track)
        return str(view["id"])

    def dataset(self, run_id: str, text: str) -> tuple[str, str]:
        sha = hashlib.sha256(text.encode()).hexdigest()
        dataset_id = new_id("ds")
        self.events.record(run_id=run_id, kind=DATASET_REGISTERED, key_id=run_id,
                           data={"dataset_id": dataset_id, "sha256": sha, "rows": 1, "bytes": len(text),
                                 "format": "jsonl", "name": "d"})
        return dataset_id, sha

    def train(self, run_id: str, *, base: str = "tiny", parent: str | None = None,
              datasets: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (), record_job: bool = True) -> str:
        job_id, experiment = new_id("ftjob"), new_id("exp")
        with self.store.transaction() as s:
            s.add(TrainingJob(id=job_id, run_id=run_id, key_id=run_id, status="succeeded", base_model=base,
                              parent_checkpoint_id=parent, dataset_ids=[d for d, _ in datasets], config={},
                              config_hash="c" * 64, loss_module_hash=None, experiment_id=experiment, total_steps=2))
        view = self.registry.save(model=Adapter(new_id("w").encode()), run_id=run_id, job_id=job_id, base_model=base,
                                  parent=parent, dataset_hashes=[sha for _, sha in datasets], config_hash="c" * 64,
                                  loss_module_hash=None, step=2, metrics={}, experiment_id=experiment,
                                  events=self.events, key_id=run_id)
        if record_job:
            self.events.record(run_id=run_id, kind=TRAINING_JOB, key_id=run_id, experiment_id=experiment, data={
                "job_id": job_id, "status": "succeeded", "base_model": base, "input_checkpoint": parent,
                "config_hash": "c" * 64, "datasets": [{"id": d, "sha256": sha} for d, sha in datasets],
                "loss_module_hash": None, "output_checkpoints": [view["id"]], "steps": 2, "cost_nusd": 0})
        return str(view["id"])

    def ctx(self, run_id: str, config: GymConfig = CONFIG) -> AuditContext:
        return AuditContext(store=self.store, config=config, data_dir=self.data_dir, events=self.events, run_id=run_id)

    def row(self, ckpt: str) -> Checkpoint:
        with self.store.transaction() as s:
            row = s.get(Checkpoint, ckpt)
            assert row is not None
            return row


@pytest.fixture
def platform(store: Store, tmp_path: Path) -> Platform:
    data = tmp_path / "data"
    return Platform(store, data, EventLog(store, SECRET), CheckpointRegistry(store, data / "checkpoints"))


def submit(p: Platform, run_id: str, ckpt: str | None, harness: str = "minimal", model: str | None = None) -> CheckResult:
    return check_provenance(p.ctx(run_id), {"id": new_id("sub"), "checkpoint": ckpt, "model": model or ckpt,
                                            "harness": harness, "track": "joint"})


def flagged(result: CheckResult, category: str = "model_or_weight_substitution") -> list[str]:
    return [f.evidence for f in result.findings if f.category == category and f.code == "EXECUTED"]


def chain(p: Platform, run: str, links: int = 2) -> list[str]:
    """base → c1 → c2 …, each link on a dataset of its own; returns the checkpoint ids, root first."""
    out: list[str] = []
    for i in range(links):
        out.append(p.train(run, parent=out[-1] if out else None, datasets=[p.dataset(run, f"data {i}")]))
    return out


def test_a_clean_chain_passes_with_its_lineage(platform: Platform) -> None:
    run = platform.run_key(bases=["tiny"])
    c1, c2 = chain(platform, run)
    result = submit(platform, run, c2)
    assert result.verdict == "pass", result.findings
    assert result.findings == []
    assert [link["checkpoint"] for link in result.details["lineage"]] == [c2, c1]
    for link in result.details["lineage"]:
        hashes = link["weights_hash"]
        assert hashes["registry"] == hashes["event"] == hashes["disk"]
        assert link["ok"] and link["base_model"] == "tiny" and link["datasets"][0]["dataset_id"]
    assert result.details["chain"]["ok"] is True
    assert [sha for _, sha in lineage_datasets(platform.ctx(run), c2)] == [
        hashlib.sha256(b"data 1").hexdigest(), hashlib.sha256(b"data 0").hexdigest()]


def test_a_base_model_submission_without_checkpoint_passes(platform: Platform) -> None:
    run = platform.run_key(track="harness")
    assert submit(platform, run, None, model="tiny").verdict == "pass"
    assert flagged(submit(platform, run, None, model="gpt-4o"))


def test_a_checkpoint_trained_from_a_base_the_track_does_not_allow_is_flagged(platform: Platform) -> None:
    run = platform.run_key(bases=["tiny"])
    ckpt = platform.train(run, base="other", datasets=[platform.dataset(run, "x")])
    result = submit(platform, run, ckpt)
    assert result.verdict == "flag"
    (evidence,) = flagged(result)
    assert "'other'" in evidence and "allows ['tiny']" in evidence
    assert result.findings[0].experiment_ids == [platform.row(ckpt).experiment_id]
    harness_run = platform.run_key(track="harness")  # no training at all on this track
    assert "does not grant training" in " ".join(flagged(submit(platform, harness_run, ckpt)))


def test_a_link_switching_base_inside_the_chain_is_flagged(platform: Platform) -> None:
    run = platform.run_key()  # models = "*": any base the gym offers, but one chain keeps one base
    parent = platform.train(run, base="tiny", datasets=[platform.dataset(run, "a")])
    child = platform.train(run, base="other", parent=parent, datasets=[platform.dataset(run, "b")])
    result = submit(platform, run, child)
    assert result.verdict == "flag"
    evidence = " ".join(flagged(result))
    assert f"its parent {parent} has 'tiny'" in evidence
    assert {e for f in result.findings for e in f.experiment_ids} == {platform.row(child).experiment_id}


def test_a_checkpoint_trained_by_another_run_is_flagged(platform: Platform) -> None:
    run, other = platform.run_key(), platform.run_key()
    foreign = platform.train(other, datasets=[platform.dataset(other, "theirs")])
    assert submit(platform, other, foreign).verdict == "pass"  # fine for the run that trained it
    result = submit(platform, run, foreign)
    assert result.verdict == "flag"
    evidence = " ".join(flagged(result))
    assert f"checkpoint {foreign} belongs to another run" in evidence
    assert "no checkpoint.registered event in this run's records" in evidence
    # … also when hidden one link up: this run fine-tunes the other run's checkpoint
    mine = platform.train(run, parent=foreign, datasets=[platform.dataset(run, "mine")])
    result = submit(platform, run, mine)
    assert result.verdict == "flag"
    assert all(foreign in e for e in flagged(result))
    # … and when the attacker rewrites the registry row to claim it
    with platform.store.transaction() as s:
        s.execute(update(Checkpoint).where(Checkpoint.id == foreign).values(run_id=run))
    assert any("no checkpoint.registered event" in e for e in flagged(submit(platform, run, foreign)))


def test_weights_changed_after_registration_are_flagged(platform: Platform) -> None:
    run = platform.run_key()
    c1, c2 = chain(platform, run)
    weights = Path(platform.row(c1).path) / "adapter_model.safetensors"
    weights.write_bytes(b"weights of some other model")
    result = submit(platform, run, c2)
    assert result.verdict == "flag"
    evidence = flagged(result)
    assert any(f"checkpoint {c1}: weights on disk hash to" in e for e in evidence)
    assert {e for f in result.findings for e in f.experiment_ids} == {platform.row(c1).experiment_id}
    # the attacker also "fixes" the registry: the platform's record still disagrees
    disk = result.details["lineage"][1]["weights_hash"]["disk"]
    with platform.store.transaction() as s:
        s.execute(update(Checkpoint).where(Checkpoint.id == c1).values(weights_hash=disk))
    joined = " ".join(flagged(submit(platform, run, c2)))
    assert "differs from the recorded" in joined and "the record says" in joined
    # and a weights directory that is gone altogether
    for f in Path(platform.row(c2).path).iterdir():
        f.unlink()
    Path(platform.row(c2).path).rmdir()
    assert any("is missing" in e for e in flagged(submit(platform, run, c2)))


def test_a_dataset_missing_from_the_records_is_flagged(platform: Platform) -> None:
    run = platform.run_key()
    recorded = platform.dataset(run, "recorded")
    ghost = ("ds_ghost", hashlib.sha256(b"never uploaded").hexdigest())
    ckpt = platform.train(run, datasets=[recorded, ghost])
    result = submit(platform, run, ckpt)
    assert result.verdict == "flag"
    (evidence,) = flagged(result)
    assert ghost[1] in evidence and "never registered" in evidence
    assert lineage_datasets(platform.ctx(run), ckpt) == [recorded]


def test_a_checkpoint_without_its_training_job_record_is_flagged(platform: Platform) -> None:
    run = platform.run_key()
    ckpt = platform.train(run, datasets=[platform.dataset(run, "x")], record_job=False)
    assert any("no training.job event" in e for e in flagged(submit(platform, run, ckpt)))


def upload_harness(platform: Platform, run: str, tmp_path: Path) -> dict[str, Any]:
    src = tmp_path / "harness-src"
    src.mkdir()
    (src / "harness.toml").write_text('[harness]\nname = "mine"\nrun = "python3 /harness/agent.py"\n')
    (src / "agent.py").write_text("print('hello')\n")
    build_archive(src, tmp_path / "h.tar.gz")
    store = HarnessStore(platform.store, platform.data_dir / "evaluation" / "harnesses", events=platform.events)
    return store.upload(run_id=run, key_id=run, raw=(tmp_path / "h.tar.gz").read_bytes())


def test_a_harness_whose_archive_or_tree_changed_after_upload_is_flagged(platform: Platform, tmp_path: Path) -> None:
    run = platform.run_key()
    ckpt = chain(platform, run, 1)[0]
    harness = upload_harness(platform, run, tmp_path)
    result = submit(platform, run, ckpt, harness=harness["id"])
    assert result.verdict == "pass", result.findings
    assert result.details["harness"]["sha256"]["archive"] == harness["sha256"]
    other = platform.run_key()
    assert "not a harness this run uploaded" in " ".join(flagged(submit(platform, other, None, harness["id"], "tiny")))

    root = platform.data_dir / "evaluation" / "harnesses"
    (root / harness["sha256"] / "agent.py").write_text("print(open('/solution/solve.sh').read())\n")
    evidence = " ".join(flagged(submit(platform, run, ckpt, harness=harness["id"]), "evaluation_tampering"))
    assert "agent.py differs from the uploaded archive" in evidence

    archive = root / f"{harness['sha256']}.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"\0")
    evidence = " ".join(flagged(submit(platform, run, ckpt, harness=harness["id"]), "evaluation_tampering"))
    assert f"the stored archive hashes to {hashlib.sha256(archive.read_bytes()).hexdigest()}" in evidence


def tamper_change(store: Store, run: str) -> None:
    with store.transaction() as s:
        s.execute(update(RecordEvent).where(RecordEvent.run_id == run, RecordEvent.seq == 2)
                  .values(data={"dataset_id": "ds_x", "sha256": "0" * 64, "rows": 1, "bytes": 1, "format": "jsonl",
                                "name": "d"}))


def tamper_delete(store: Store, run: str) -> None:
    with store.transaction() as s:
        s.execute(delete(RecordEvent).where(RecordEvent.run_id == run, RecordEvent.seq == 2))


def tamper_truncate(store: Store, run: str) -> None:
    with store.transaction() as s:
        last = s.get(RecordHead, run)
        assert last is not None
        s.execute(delete(RecordEvent).where(RecordEvent.run_id == run, RecordEvent.seq == last.seq))


@pytest.mark.parametrize(("attack", "problem"), [(tamper_change, "changed"), (tamper_delete, "deleted"),
                                                 (tamper_truncate, "truncated")])
def test_edits_to_the_record_chain_are_flagged(platform: Platform, attack: Any, problem: str) -> None:
    run = platform.run_key()
    c1, c2 = chain(platform, run)
    assert submit(platform, run, c2).verdict == "pass"
    attack(platform.store, run)
    result = submit(platform, run, c2)
    assert result.verdict == "flag"
    assert result.details["chain"]["ok"] is False
    assert any(f"record chain: {problem} at event" in e for e in flagged(result, "evaluation_tampering"))


def test_a_refused_upload_keeps_no_archive(platform: Platform, tmp_path: Path) -> None:
    from kit.errors import Unprocessable

    store = HarnessStore(platform.store, platform.data_dir / "evaluation" / "harnesses", events=platform.events)
    with pytest.raises(Unprocessable):
        store.upload(run_id="key_x", key_id="key_x", raw=b"not a tarball")
    assert list(store.root.iterdir()) == []
