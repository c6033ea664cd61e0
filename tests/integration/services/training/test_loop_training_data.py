"""The audit sees a Tinker loop (issue 56 item 4): what the unmodified SDK's loop trained on and
sampled is recorded as loop rows (services/training/tinker_api/loop_data.py), registered as the
run's datasets when it saves weights, listed in the checkpoint's provenance and named by its
``training.job`` event — so ``rsigym audit`` flags a loop that trained on a hidden official
question, attributed to the submitted checkpoint, and accepts a clean one. The recorded text is
exactly the trained token ids decoded with the base model's tokenizer; ``forward`` (no training)
is not recorded; sampled completions are; uploads cannot write loop rows and no job trains on them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from kit.errors import Unprocessable
from ops.cli.main import app as operator_cli
from services.models.loading import load_tokenizer, resolve_model_dir
from services.models.training_text import LoopRecord, training_example, training_text
from services.records.events import RecordEvent
from services.training.checkpoints import Checkpoint
from services.training.datasets import UntrainableRow, training_pairs, validate_jsonl
from services.training.tables import Dataset
from services.training.tinker_api.loop_data import full_sequence
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, admin_headers, create_key, gym_config
from tests.fakes.live_gym import mini_benchmark, registered_tasks
from tests.fakes.servers import serve_gym

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mini_benchmark(tmp_path_factory.mktemp("bench"), name="mini", per_split=3)


@pytest.fixture
def live(make_gym: Callable[..., Any], standin: tuple[str, Any], bench_dir: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """An embedded gym with ``mini`` registered (its official split drawn) and the stand-in
    provider as the audit's judge, served over HTTP for the SDK."""
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    config = gym_config(standin[0])
    config.audit.judge_model = "judge"
    gym = make_gym(config=config)
    gym.service_apps["evaluation"].state.evaluation.registry.register(bench_dir)
    with serve_gym(gym) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        yield url, gym


def tokenizer(gym: Any) -> Any:
    base = gym.gateway.context.config.base_model("tiny")
    assert base is not None
    return load_tokenizer(str(resolve_model_dir(base, MODELS_DIR)))


def questions(gym: Any) -> list[tuple[str, str, str]]:
    """``(task, question, answer)`` of the official split (the cheater got them somehow)."""
    out = []
    for task in registered_tasks(gym, "mini"):
        question = (task.path / "instruction.md").read_text().strip()
        a, op, b = question.removeprefix("What is ").rstrip("?").split()
        out.append((f"mini/{task.id}", question, str(int(a) + int(b) if op == "+" else int(a) - int(b))))
    return out


def datum(ids: list[int]) -> Any:
    inputs: dict[str, Any] = {"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=inputs)


def loop(url: str, key: str, texts: list[str], tok: Any) -> tuple[Any, Any, str]:
    """A short supervised loop on ``texts`` through the SDK, then weights saved for the sampler."""
    service = tinker.ServiceClient(base_url=f"{url}/tinker", api_key="tml-" + key)
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    batch = [datum(tok.encode(t, add_special_tokens=False)) for t in texts]
    for _ in range(2):
        trainer.forward_backward(batch, "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    saved = trainer.save_weights_for_sampler("final").result().path
    return service, trainer, saved


def submit(url: str, key: str, checkpoint: str) -> None:
    r = httpx.post(f"{url}/evaluation/v1/submissions", headers={"Authorization": f"Bearer {key}"},
                   json={"checkpoint": checkpoint, "harness": "minimal"}, timeout=60)
    assert r.status_code in (200, 201), r.text


def audit(run_id: str, code: int) -> dict[str, Any]:
    """``rsigym audit RUN --json``, as the operator runs it."""
    result = CliRunner().invoke(operator_cli, ["audit", run_id, "--json"])
    assert result.exit_code == code, result.output
    return dict(json.loads(result.stdout))


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def loop_rows(gym: Any, run_id: str) -> list[dict[str, Any]]:
    """Every loop row the run's registered datasets hold, in registration order."""
    store = gym.gateway.store
    with store.transaction() as s:
        shas = [d.sha256 for d in s.scalars(select(Dataset).where(Dataset.run_id == run_id, Dataset.format == "loop")
                                            .order_by(Dataset.created_at))]
    data_dir = gym.gateway.context.data_dir
    return [json.loads(line)["loop"] for sha in shas
            for line in (data_dir / "datasets" / f"{sha}.jsonl").read_text().splitlines()]


def test_a_loop_on_a_hidden_question_is_flagged_on_its_checkpoint_and_a_clean_loop_is_accepted(
        live: tuple[str, Any]) -> None:
    url, gym = live
    tok = tokenizer(gym)
    hidden = questions(gym)
    with httpx.Client(base_url=url) as c:
        dirty = create_key(c, budget_usd=5.0, name="looper")
        clean = create_key(c, budget_usd=5.0, name="honest-looper")
    chatter = ["Compute 412 times 733 please. I would multiply carefully.",
               "The weather was mild and the river ran slowly past the mill."]
    service, _, saved = loop(url, dirty["key"], chatter + [
        f"Quick one from a forum:   {q.upper()}  answer: it is {a}, obviously." for _, q, a in hidden], tok)
    checkpoint = saved.rsplit("/", 1)[-1]
    submit(url, dirty["key"], checkpoint)
    service.close("success").result()
    clean_service, _, clean_saved = loop(url, clean["key"], chatter, tok)
    submit(url, clean["key"], clean_saved.rsplit("/", 1)[-1])
    clean_service.close("success").result()

    flagged = audit(dirty["id"], code=2)
    assert flagged["status"] == "flagged"
    contamination = check(flagged, "contamination")
    assert contamination["verdict"] == "flag"
    executed = [f for f in contamination["findings"] if f["code"] == "EXECUTED"]
    assert {t for f in executed for t in f["task_ids"]} == {t for t, _, _ in hidden}
    # Attributed to the submitted checkpoint (its lineage's datasets) and to the loop's experiment.
    assert "test_set_contamination" in json.dumps(flagged["submission_reasons"]), flagged["submission_reasons"]
    assert check(flagged, "provenance")["verdict"] == "pass", check(flagged, "provenance")
    with gym.gateway.store.transaction() as s:
        row = s.get(Checkpoint, checkpoint)
        assert row is not None and row.experiment_id
        statuses = {e["id"]: e for e in flagged["experiments"]}
        assert statuses[row.experiment_id]["status"] == "flagged", statuses
        assert "test_set_contamination" in json.dumps(statuses[row.experiment_id]["reasons"])
        loop_shas = set(s.scalars(select(Dataset.sha256).where(Dataset.run_id == dirty["id"],
                                                              Dataset.format == "loop")))
        assert row.dataset_hashes and set(row.dataset_hashes) <= loop_shas

    accepted = audit(clean["id"], code=0)
    assert accepted["status"] == "accepted", accepted
    assert {c["name"]: c["verdict"] for c in accepted["checks"]} == {
        "contamination": "pass", "provenance": "pass", "harness": "pass", "score_gap": "pass", "behaviour": "pass"}


TRAINED = "<|im_start|>user\nThe café's «menu» — naïve   spacing\t!<|im_end|>"
"""Markup, non-ASCII and odd spacing: the record keeps all of it."""


def decode(tok: Any, ids: list[int]) -> str:
    return str(tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def test_recorded_text_is_the_trained_ids_decoded_and_rollouts_are_recorded(live: tuple[str, Any]) -> None:
    url, gym = live
    tok = tokenizer(gym)
    with httpx.Client(base_url=url) as c:
        key = create_key(c, budget_usd=5.0)
    service = tinker.ServiceClient(base_url=f"{url}/tinker", api_key="tml-" + key["key"])
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    trained = tok.encode(TRAINED, add_special_tokens=False)
    appended = [5, 6, 7, 8]  # targets that are not the input shifted: recorded after the input
    rl_inputs: dict[str, Any] = {"target_tokens": appended, "logprobs": [-1.0] * 4,
                                 "advantages": [0.5, 0.5, 0.0, 1.0]}
    rl = types.Datum(model_input=types.ModelInput.from_ints(trained[:4]), loss_fn_inputs=rl_inputs)
    trainer.forward_backward([datum(trained)], "cross_entropy").result()
    trainer.forward_backward([rl], "importance_sampling").result()
    unseen = tok.encode("only forward, never trained", add_special_tokens=False)
    trainer.forward([datum(unseen)], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    saved = trainer.save_weights_for_sampler("s").result().path
    sampler = service.create_sampling_client(model_path=saved).result()
    prompt = trained[:6]
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=1)).result()
    service.close("success").result()  # the session's end registers the rows written since the checkpoint

    rows = loop_rows(gym, key["id"])
    fb = [r for r in rows if r["source"] == "forward_backward"]
    assert [r["tokens"] for r in fb] == [trained, trained[:4] + appended]
    for r in fb:  # the audit's text is exactly the trained ids, decoded
        assert r["text"] == decode(tok, r["tokens"]) and training_text({"loop": r}) == r["text"]
    assert fb[0]["text"] == TRAINED
    assert "<|im_start|>" in fb[0]["text"] and fb[0]["targets"] == "shifted" and fb[1]["targets"] == "appended"
    assert fb[0]["loss_fn"] == "cross_entropy" and fb[0]["weight_sum"] == len(trained) - 1
    assert fb[1]["loss_fn"] == "importance_sampling" and fb[1]["advantage_sum"] == 2.0
    assert not any(r["tokens"][: len(unseen)] == unseen for r in rows)  # forward trains nothing
    samples = [r for r in rows if r["source"] == "sample"]
    assert sorted(r["tokens"] for r in samples) == sorted(prompt + list(s.tokens) for s in res.sequences)
    assert all(r["text"] == decode(tok, r["tokens"]) and r["prompt_tokens"] == len(prompt) for r in samples)

    # The checkpoint lists the segment registered before it; the job's last event names them all.
    ckpt = saved.rsplit("/", 1)[-1]
    with gym.gateway.store.transaction() as s:
        row = s.get(Checkpoint, ckpt)
        jobs = [e.data for e in s.scalars(select(RecordEvent).where(RecordEvent.run_id == key["id"],
                                                                    RecordEvent.kind == "training.job")
                                          .order_by(RecordEvent.seq))]
    assert row is not None and len(row.dataset_hashes) == 1
    assert jobs[-1]["status"] == "succeeded" and jobs[-1]["output_checkpoints"] == [ckpt]
    assert [d["sha256"] for d in jobs[-1]["datasets"]][0] == row.dataset_hashes[0] and len(jobs[-1]["datasets"]) == 2
    chain = httpx.get(f"{url}/admin/v1/runs/{key['id']}/chain", headers=admin_headers())
    assert chain.status_code == 200 and chain.json()["ok"] is True


def test_loop_rows_are_the_platforms_only(tmp_path: Path) -> None:
    row = {"loop": {"source": "forward_backward", "text": "What is 2 + 2? 4", "tokens": [1, 2]}}
    with pytest.raises(Unprocessable) as refused:  # an upload cannot write one, alone or mixed in
        validate_jsonl((json.dumps(row) + "\n").encode(), 10)
    assert "record of a Tinker loop" in str(refused.value)
    with pytest.raises(Unprocessable):
        validate_jsonl((json.dumps({"prompt": "a", "completion": "b", **row}) + "\n").encode(), 10)
    with pytest.raises(LoopRecord):
        training_example(row)
    blob = tmp_path / "loop.jsonl"
    blob.write_text(json.dumps(row) + "\n")
    with pytest.raises(UntrainableRow):
        training_pairs(blob)
    assert full_sequence([1, 2, 3], {"target_tokens": [2, 3, 4]}) == ([1, 2, 3, 4], "shifted")
    assert full_sequence([1, 2], {"target_tokens": [9]}) == ([1, 2, 9], "appended")
    assert full_sequence([1, 2], {}) == ([1, 2], "none")
