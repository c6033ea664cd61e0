"""The scale backends against faithful fakes: vLLM (runtime LoRA over HTTP) and Tinker (remote training).

The fake vLLM server answers with the real local engine, so the vLLM path must give the local
engine's answer for the same adapter; the fake Tinker service really trains a LoRA on the tiny
model, and the trainer meters it through a real ledger on SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from access.keys import KeyRegistry
from access.presets import preset_policy
from billing.ledger import Ledger, StepMeter
from billing.money import token_cost_nusd
from kit.config import BaseModel_, GymConfig
from kit.errors import ServiceUnavailable, Unprocessable, UpstreamError
from kit.settings import StoreSettings
from services.inference.backends.base import Adapter, Sampling
from services.inference.backends.local import LocalEngine
from services.inference.backends.tinker import TinkerEngine
from services.inference.backends.vllm import VLLMEngine
from services.models.chat_format import render_prompt, split_example
from services.models.loading import load_tokenizer, resolve_model_dir
from services.models.tinker_client import MANIFEST, TinkerWeights, tinker_manifest
from services.training.backends.tinker import TinkerTrainer
from services.training.checkpoints import Checkpoint, CheckpointRegistry
from services.training.schemas import JobRequest
from services.training.tables import TrainingJob
from services.training.trainer import Resume, StepReport, TrainingInputs, run_training
from storage.store import Store, sqlite_url
from storage.tables import ApiKey
from tests.conftest import MODELS_DIR
from tests.fakes.fake_tinker import FakeServiceClient, FakeTinkerConnectionError
from tests.fakes.fake_vllm import create_fake_vllm
from tests.fakes.servers import free_port, serve
from tests.fakes.tiny_lora import random_lora, torch_threads

TINKER_BASE = "fake/tiny-qwen3"
PRICE = 2.0  # USD per million training tokens


def tiny_base(**extra: Any) -> BaseModel_:
    return BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=PRICE, prefill_usd_per_mtok=0.2,
                      sample_usd_per_mtok=0.6, **extra)


def ask(question: str) -> str:
    return render_prompt([{"role": "user", "content": question}])


GREEDY = Sampling(max_tokens=24, temperature=0.0)
PROMPTS = [ask("What is 23 + 19?"), ask("Repeat: red lion")]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_dir(tiny_base(), MODELS_DIR)  # builds the tiny model once, cached across runs


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Adapter]:
    """Three checkpoints; the first two are versions 1 and 2 of one lineage (own id, own directory)."""
    root = tmp_path_factory.mktemp("adapters")
    return [Adapter(f"ckpt_v{i}", str(random_lora(model_dir, root / f"ckpt_v{i}", seed=100 + i))) for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def local(model_dir: Path) -> LocalEngine:
    return LocalEngine(MODELS_DIR, max_adapters=8)


@pytest.fixture(scope="module")
def expected(local: LocalEngine, adapters: list[Adapter]) -> dict[tuple[str | None, str], Any]:
    """The local engine's greedy answers: (adapter key or None, prompt) -> Generation."""
    base = tiny_base()
    return {(a.key if a else None, p): local.generate(base, a, p, GREEDY) for a in [None, *adapters] for p in PROMPTS}


@pytest.fixture(scope="module")
def vllm_engine_backend(model_dir: Path) -> LocalEngine:
    """The fake server's own local engine (a separate instance from the reference one)."""
    return LocalEngine(MODELS_DIR, max_adapters=8)


@pytest.fixture
def fake_vllm(vllm_engine_backend: LocalEngine) -> Iterator[tuple[str, Any]]:
    app = create_fake_vllm(vllm_engine_backend, tiny_base())
    with serve(app) as url:
        yield url, app.state.vllm


# -- vLLM ---------------------------------------------------------------------------------------


def test_vllm_answers_equal_the_local_engine_for_the_same_adapter(fake_vllm: tuple[str, Any], adapters: list[Adapter],
                                                                  expected: dict[Any, Any], local: LocalEngine) -> None:
    url, _ = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url + "/v1")
    engine = VLLMEngine(max_adapters=8)
    for prompt in PROMPTS:
        assert engine.prompt_tokens(base, prompt) == local.prompt_tokens(base, prompt)
        for adapter in [None, *adapters]:
            assert engine.generate(base, adapter, prompt, GREEDY) == expected[(adapter.key if adapter else None, prompt)]
    # The adapters matter: a stale or missing adapter would have answered like another one.
    answers = {tuple(expected[(a.key if a else None, p)].text for p in PROMPTS) for a in [None, *adapters]}
    assert len(answers) == 4


def test_vllm_is_sent_min_tokens_and_answers_as_the_local_engine_does(fake_vllm: tuple[str, Any],
                                                                      local: LocalEngine) -> None:
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url + "/v1")
    engine = VLLMEngine(max_adapters=8)
    sampling = Sampling(max_tokens=24, temperature=0.0, min_tokens=24)
    for prompt in PROMPTS:
        got = engine.generate(base, None, prompt, sampling)
        assert got == local.generate(base, None, prompt, sampling)
        assert (got.completion_tokens, got.finish_reason) == (24, "length")
        assert state.completions[-1]["min_tokens"] == 24
    engine.generate(base, None, PROMPTS[0], GREEDY)
    assert "min_tokens" not in state.completions[-1]  # not sent when not asked


def test_vllm_loads_each_checkpoint_once_under_its_own_name_and_evicts_lru(fake_vllm: tuple[str, Any],
                                                                          adapters: list[Adapter],
                                                                          expected: dict[Any, Any]) -> None:
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    engine = VLLMEngine(max_adapters=2)
    v1, v2, v3 = adapters
    prompt = PROMPTS[0]
    for adapter in [v1, v1, v2, v1, v2]:
        assert engine.generate(base, adapter, prompt, GREEDY) == expected[(adapter.key, prompt)]
    assert state.loads == [(v1.key, v1.path), (v2.key, v2.path)] and state.unloads == []
    assert engine.generate(base, v3, prompt, GREEDY) == expected[(v3.key, prompt)]
    assert state.unloads == [v1.key]  # least recently used
    assert engine.generate(base, v2, prompt, GREEDY) == expected[(v2.key, prompt)]  # still loaded: no load
    assert engine.generate(base, v1, prompt, GREEDY) == expected[(v1.key, prompt)]  # evicted: loaded again
    assert state.unloads == [v1.key, v3.key]
    assert [name for name, _ in state.loads] == [v1.key, v2.key, v3.key, v1.key]
    assert sorted(state.adapters) == sorted([v1.key, v2.key]) == sorted(engine.loaded_adapters(base))
    # One name, one set of weights: no name was ever loaded from two directories.
    assert {name: {p for n, p in state.loads if n == name} for name, _ in state.loads} == {
        a.key: {a.path} for a in adapters}
    assert all(c["model"] in (base.name, v1.key, v2.key, v3.key) for c in state.completions)
    # Reusing a loaded name for other weights is refused, not served stale.
    with pytest.raises(UpstreamError, match="never reused"):
        engine.generate(base, Adapter(v1.key, v2.path), prompt, GREEDY)


def test_vllm_streams_pieces_that_join_to_the_answer(fake_vllm: tuple[str, Any], adapters: list[Adapter],
                                                     expected: dict[Any, Any]) -> None:
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    engine = VLLMEngine()
    for adapter in (None, adapters[1]):
        pieces: list[str] = []
        generation = engine.generate(base, adapter, PROMPTS[1], GREEDY, pieces.append)
        assert generation == expected[(adapter.key if adapter else None, PROMPTS[1])]
        assert "".join(pieces) == generation.text and len(pieces) >= 2
    assert all(c["stream"] for c in state.completions)


def test_vllm_adapters_stay_loaded_while_in_use_under_concurrency(fake_vllm: tuple[str, Any], adapters: list[Adapter],
                                                                  expected: dict[Any, Any]) -> None:
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    engine = VLLMEngine(max_adapters=1)
    results: list[tuple[Adapter, Any]] = []
    errors: list[BaseException] = []

    def worker(adapter: Adapter) -> None:
        try:
            for _ in range(2):
                results.append((adapter, engine.generate(base, adapter, PROMPTS[0], GREEDY)))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(a,)) for a in adapters * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(results) == 12 and all(gen == expected[(a.key, PROMPTS[0])] for a, gen in results)
    # Every completion named an adapter the server held at that moment (no 404 was retried away).
    assert state.misses == [] and len(state.completions) == 12
    assert len(state.adapters) <= 1 and len(engine.loaded_adapters(base)) <= 1


def test_vllm_never_unloads_an_adapter_a_generation_is_using(fake_vllm: tuple[str, Any], adapters: list[Adapter],
                                                             expected: dict[Any, Any]) -> None:
    """While v1 streams, two other adapters are served (limit 1): they are evicted, v1 is not."""
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    engine = VLLMEngine(max_adapters=1)
    v1, v2, v3 = adapters
    nested: list[Any] = []
    unloaded_meanwhile: list[str] = []

    def on_text(piece: str) -> None:
        if not nested:
            nested.extend(engine.generate(base, a, PROMPTS[0], GREEDY) for a in (v2, v3))
            unloaded_meanwhile.extend(state.unloads)

    assert engine.generate(base, v1, PROMPTS[1], GREEDY, on_text) == expected[(v1.key, PROMPTS[1])]
    assert nested == [expected[(v2.key, PROMPTS[0])], expected[(v3.key, PROMPTS[0])]]
    assert unloaded_meanwhile == [v2.key, v3.key] == state.unloads
    assert engine.loaded_adapters(base) == [v1.key] and list(state.adapters) == [v1.key]


def test_vllm_reloads_after_a_server_restart(fake_vllm: tuple[str, Any], adapters: list[Adapter],
                                             expected: dict[Any, Any]) -> None:
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    engine = VLLMEngine()
    v1 = adapters[0]
    assert engine.generate(base, v1, PROMPTS[0], GREEDY) == expected[(v1.key, PROMPTS[0])]
    state.forget_all()
    assert engine.generate(base, v1, PROMPTS[0], GREEDY) == expected[(v1.key, PROMPTS[0])]
    assert [name for name, _ in state.loads] == [v1.key, v1.key] and state.misses == [v1.key]


def test_vllm_errors_are_clear(fake_vllm: tuple[str, Any], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    engine = VLLMEngine(connect_timeout_s=2)
    with pytest.raises(ServiceUnavailable, match=f"vLLM server {dead} is unreachable"):
        engine.prompt_tokens(tiny_base(backend="vllm", vllm_url=dead + "/v1"), PROMPTS[0])
    with pytest.raises(ServiceUnavailable, match="unreachable"):
        engine.generate(tiny_base(backend="vllm", vllm_url=dead), None, PROMPTS[0], GREEDY)
    with pytest.raises(ServiceUnavailable, match="no vllm_url"):
        engine.prompt_tokens(tiny_base(backend="vllm"), PROMPTS[0])
    url, state = fake_vllm
    base = tiny_base(backend="vllm", vllm_url=url)
    with pytest.raises(UpstreamError, match="refused loading adapter ckpt_gone: HTTP 404: No adapter found"):
        engine.generate(base, Adapter("ckpt_gone", str(tmp_path / "missing")), PROMPTS[0], GREEDY)
    assert engine.loaded_adapters(base) == [] and state.loads == []


# -- Tinker -------------------------------------------------------------------------------------


def examples(n: int) -> list[tuple[str, str]]:
    return [split_example([{"role": "user", "content": f"What is {40 + i} - {i + 3}?"},
                           {"role": "assistant", "content": str(37)}]) for i in range(n)]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(sqlite_url(tmp_path), StoreSettings())
    store.migrate()
    yield store
    store.dispose()


def new_key(store: Store, budget_nusd: int) -> str:
    view, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=budget_nusd)
    return view["id"]


def account(store: Store, key_id: str) -> tuple[int, int]:
    with store.transaction() as s:
        row = s.get(ApiKey, key_id)
        return row.spent_nusd, row.reserved_nusd


class Job:
    """What the job runner passes to a trainer, with a real registry behind on_checkpoint."""

    def __init__(self, store: Store, root: Path, key: str):
        self.registry = CheckpointRegistry(store, root / "checkpoints")
        self.reports: list[StepReport] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.meter = StepMeter(Ledger(store), key, "training", "train_step", ref_id="job_t")
        with store.transaction() as s:
            if s.get(TrainingJob, "job_t") is None:
                s.add(TrainingJob(id="job_t", run_id="run_t", key_id=key, base_model="tiny", dataset_ids=[], config={},
                                  config_hash="c" * 64, loss_module_hash=None, total_steps=0))
        self.stop_after: int | None = None

    def on_checkpoint(self, model: Any, step: int, metrics: dict[str, Any]) -> None:
        self.checkpoints.append(self.registry.save(
            model=model, run_id="run_t", job_id="job_t", base_model="tiny", parent=None, dataset_hashes=["d" * 64],
            config_hash="c" * 64, loss_module_hash=None, step=step, metrics=metrics))

    def run(self, client: Any, model_dir: Path, pairs: list[tuple[str, str]], steps: int, **request: Any) -> Any:
        parent = request.pop("parent", None)
        resume = request.pop("resume", None)
        trainer = request.pop("trainer", None) or TinkerTrainer(client, TINKER_BASE)
        req = JobRequest.model_validate({"datasets": ["ds_1"], "base_model": "tiny", "steps": steps, **request})
        inputs = TrainingInputs(model_dir=str(model_dir), parent_adapter=parent, pairs=pairs, request=req, steps=steps,
                                resume=resume)
        return run_training(trainer, inputs, train_usd_per_mtok=PRICE, meter=self.meter,
                            on_step=self.reports.append, on_checkpoint=self.on_checkpoint,
                            should_stop=lambda: self.stop_after is not None and len(self.reports) >= self.stop_after)


def step_cost(model_dir: Path, pairs: list[tuple[str, str]]) -> tuple[int, int]:
    """Tokens and price of one full-batch step, computed independently of the trainer."""
    tok = load_tokenizer(str(model_dir))
    tokens = sum(len(tok.encode(p + a, add_special_tokens=False)) for p, a in pairs)
    return tokens, token_cost_nusd(tokens, PRICE)


def test_tinker_trainer_meters_every_step_and_stops_at_the_step_the_budget_cannot_pay(
        sqlite_store: Store, model_dir: Path, tmp_path: Path) -> None:
    pairs = examples(4)
    tokens, cost = step_cost(model_dir, pairs)
    key = new_key(sqlite_store, 3 * cost + cost // 2)  # pays for exactly three steps
    fake = FakeServiceClient(model_dir, tmp_path / "tinker", TINKER_BASE)
    job = Job(sqlite_store, tmp_path, key)
    outcome = job.run(fake, model_dir, pairs, steps=10, batch_size=4, checkpoint_every=100, learning_rate=5e-3)
    assert (outcome.status, outcome.steps) == ("budget_exhausted", 3)
    assert "step 4" in (outcome.error or "")
    assert [(r.step, r.tokens, r.cost_nusd) for r in job.reports] == [(s, tokens, cost) for s in (1, 2, 3)]
    assert account(sqlite_store, key) == (3 * cost, 0)  # nothing charged or held for the refused step
    entries = Ledger(sqlite_store).entries(key)
    assert len(entries) == 3 and all(e["ref_id"] == "job_t" for e in entries)
    # The refused step never reached Tinker.
    assert fake.count("forward_backward") == 3 and fake.count("optim_step") == 3
    assert all(details["loss_fn"] == "cross_entropy" and details["n"] == 4
               for name, details in fake.calls if name == "forward_backward")
    # The last performed step is kept as a checkpoint the registry could hash.
    assert [c["step"] for c in job.checkpoints] == [3]
    with sqlite_store.transaction() as s:
        row = s.scalars(select(Checkpoint)).one()
    manifest = tinker_manifest(row.path)
    assert manifest is not None and manifest["path"].startswith("tinker://") and manifest["step"] == 3
    assert sorted(p.name for p in Path(row.path).iterdir()) == [MANIFEST] and len(row.weights_hash) == 64


def test_a_tinker_job_resumes_from_its_checkpoints_tinker_state_or_fails_saying_why(
        sqlite_store: Store, model_dir: Path, tmp_path: Path) -> None:
    pairs = examples(8)
    key = new_key(sqlite_store, 10**12)
    fake = FakeServiceClient(model_dir, tmp_path / "tinker", TINKER_BASE)
    job = Job(sqlite_store, tmp_path, key)
    job.stop_after = 3  # the first worker gets as far as step 3; its checkpoint of step 2 is resumed
    job.run(fake, model_dir, pairs, steps=6, batch_size=4, checkpoint_every=2, learning_rate=1e-2)
    first = list(job.reports)
    with sqlite_store.transaction() as s:
        row = s.get(Checkpoint, job.checkpoints[0]["id"])
    assert row is not None
    path = row.path
    manifest = tinker_manifest(path)
    assert manifest is not None and manifest["step"] == 2 and manifest["state_path"]
    job.stop_after, job.reports = None, []
    trainer = TinkerTrainer(fake, TINKER_BASE)
    outcome = job.run(fake, model_dir, pairs, steps=6, batch_size=4, checkpoint_every=2, learning_rate=1e-2,
                      trainer=trainer, resume=Resume(step=2, adapter=path, billed_nusd=[first[2].cost_nusd]))
    assert (outcome.status, outcome.steps) == ("succeeded", 6)
    assert [(r.step, r.replayed) for r in job.reports] == [(3, True), (4, False), (5, False), (6, False)]
    assert [name for name, d in fake.calls if name == "load_state" and d["path"] == manifest["state_path"]]
    assert "weights of step 2 only" in trainer.restored()  # this client cannot load Adam's state: said so
    assert job.reports[0].cost_nusd == first[2].cost_nusd  # what it was billed by the first worker
    assert job.reports[0].tokens == first[2].tokens  # the same batch: the order skipped the two taken
    assert account(sqlite_store, key) == (sum(r.cost_nusd for r in first + job.reports[1:]), 0)  # step 3 once

    no_state = tmp_path / "no-state"  # a checkpoint whose Tinker training state was never saved
    TinkerWeights({**manifest, "state_path": None}).save_pretrained(no_state)
    failed = job.run(fake, model_dir, pairs, steps=6, batch_size=4, checkpoint_every=2,
                     resume=Resume(step=2, adapter=str(no_state)))
    assert (failed.status, failed.error) == ("failed", "cannot resume: the checkpoint of step 2 has no tinker "
                                                       "training state")


def test_tinker_training_learns_and_its_checkpoints_are_servable(sqlite_store: Store, model_dir: Path,
                                                                 tmp_path: Path, local: LocalEngine) -> None:
    pairs = examples(8)
    key = new_key(sqlite_store, 10**12)
    fake = FakeServiceClient(model_dir, tmp_path / "tinker", TINKER_BASE)
    job = Job(sqlite_store, tmp_path, key)
    outcome = job.run(fake, model_dir, pairs, steps=12, batch_size=4, checkpoint_every=6, learning_rate=1e-2,
                      schedule="linear", lora={"rank": 8})
    assert (outcome.status, outcome.steps, outcome.error) == ("succeeded", 12, None)
    losses = [r.loss for r in job.reports]
    assert losses[-1] < 0.5 * losses[0], losses
    assert [r.lr for r in job.reports][:2] == [1e-2, pytest.approx(1e-2 * (1 - 1 / 12))]
    assert [c["step"] for c in job.checkpoints] == [6, 12]
    create = next(d for n, d in fake.calls if n == "create_lora_training_client")
    assert (create["base_model"], create["rank"], create["train_unembed"]) == (TINKER_BASE, 8, False)
    spent, reserved = account(sqlite_store, key)
    assert spent == sum(r.cost_nusd for r in job.reports) and reserved == 0

    # The TinkerEngine samples from the checkpoint's tinker:// path; the answer is that of the
    # same weights served locally, and the base model is sampled by name.
    base = tiny_base(backend="tinker", tinker_base_model=TINKER_BASE)
    engine = TinkerEngine(fake, MODELS_DIR)
    ckpt = job.checkpoints[-1]
    with sqlite_store.transaction() as s:
        path = s.get(Checkpoint, ckpt["id"]).path
    manifest = tinker_manifest(path)
    assert manifest is not None
    prompt = ask("What is 45 - 8?")
    pieces: list[str] = []
    got = engine.generate(base, Adapter(ckpt["id"], path), prompt, GREEDY, pieces.append)
    want = local.generate(base, Adapter("tinker-weights-12", str(fake.local_dir(manifest["path"]))), prompt, GREEDY)
    assert (got.text, got.finish_reason) == (want.text, want.finish_reason) and "".join(pieces) == got.text
    assert got.text == "37"  # it learned the answer it was trained on
    assert got.completion_tokens == want.completion_tokens + (1 if want.finish_reason == "stop" else 0)
    assert ("create_sampling_client", {"model_path": manifest["path"], "base_model": None}) in fake.calls
    base_answer = engine.generate(base, None, prompt, GREEDY)
    assert base_answer.text == local.generate(base, None, prompt, GREEDY).text
    assert ("create_sampling_client", {"model_path": None, "base_model": TINKER_BASE}) in fake.calls
    assert engine.prompt_tokens(base, prompt) == local.prompt_tokens(base, prompt)
    calls = len(fake.calls)
    with pytest.raises(Unprocessable, match="min_tokens"):  # Tinker's sampler has no such parameter
        engine.generate(base, None, prompt, Sampling(max_tokens=8, temperature=0.0, min_tokens=4))
    assert len(fake.calls) == calls  # refused before Tinker was asked anything

    # A job continuing from this checkpoint loads its training state on Tinker.
    child = Job(sqlite_store, tmp_path, key)
    outcome = child.run(fake, model_dir, pairs, steps=1, batch_size=4, parent=path)
    assert outcome.status == "succeeded"
    assert ("load_state", {"model_id": "fake-model-2", "path": manifest["state_path"]}) in fake.calls


def test_tinker_step_failures_and_refusals(sqlite_store: Store, model_dir: Path, tmp_path: Path) -> None:
    pairs = examples(2)
    _, cost = step_cost(model_dir, pairs)
    key = new_key(sqlite_store, 10**12)
    fake = FakeServiceClient(model_dir, tmp_path / "tinker", TINKER_BASE)
    job = Job(sqlite_store, tmp_path, key)
    # The service accepted the step's forward/backward, then the connection failed: the step is
    # charged (the work may have run upstream) and the job fails.
    fake.fail_next("optim_step", FakeTinkerConnectionError("connection reset"))
    outcome = job.run(fake, model_dir, pairs, steps=1, batch_size=2)
    assert outcome.status == "failed" and "optim_step failed" in (outcome.error or "")
    assert outcome.steps == 0 and account(sqlite_store, key) == (cost, 0) and job.checkpoints == []
    # Refused before it reaches the service: nothing charged, no client created.
    calls = len(fake.calls)
    fake.fail_next("forward_backward", FakeTinkerConnectionError("connection refused"))
    outcome = job.run(fake, model_dir, pairs, steps=3, batch_size=2)
    assert outcome.status == "failed" and account(sqlite_store, key) == (cost, 0)
    assert fake.count("optim_step") == 1
    assert len(fake.calls) > calls
    # Cancellation between steps.
    job.stop_after = len(job.reports) + 2
    outcome = job.run(fake, model_dir, pairs, steps=5, batch_size=2)
    assert (outcome.status, outcome.steps) == ("cancelled", 2)
    assert account(sqlite_store, key) == (3 * cost, 0)
    # A local (non-Tinker) parent, a custom loss: refused without a call.
    calls = len(fake.calls)
    local_parent = random_lora(model_dir, tmp_path / "local_ckpt", seed=7)
    assert job.run(fake, model_dir, pairs, steps=1, parent=str(local_parent)).status == "failed"
    custom = job.run(fake, model_dir, pairs, steps=1, loss="custom", custom_loss="def loss(l, y, m): return l.sum()")
    assert custom.status == "failed" and "cross_entropy" in (custom.error or "")
    assert len(fake.calls) == calls
