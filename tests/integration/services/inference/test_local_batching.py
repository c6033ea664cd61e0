"""Continuous batching of the local engine: concurrent requests on one base model share each
forward pass, and no request can tell. A greedy completion decoded in a batch is the one the
request gets alone (and the one a plain one-row transformers loop gets); a request on adapter A
gets A's answer while B's and the bare base's requests run; a cancelled or failing reader ends
its own row only; stop sequences and ``max_tokens`` hold per row; and through the HTTP API the
usage (what metering bills) of a batched call is the usage of the same call alone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit.config import BaseModel_
from services.inference.backends.base import Adapter, Generation, Sampling
from services.inference.backends.local import LocalEngine
from services.models.chat_format import render_prompt
from services.models.loading import load_model, load_tokenizer, resolve_model_dir
from tests.conftest import MODELS_DIR, create_key
from tests.fakes.servers import serve_gym
from tests.fakes.tiny_lora import random_lora, torch_threads

TINY = BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=2.0, prefill_usd_per_mtok=0.2,
                  sample_usd_per_mtok=0.6)
QUESTIONS = [
    "What is 3 + 4?",
    "Repeat: red lion",
    "What is 57 + 38?",
    "Copy this JSON: {\"name\": \"blue whale\", \"size\": 30}",
    "Count from 3 to 9.",
    "Which is larger, 41 or 14?",
    "Repeat: the quick brown fox jumps over the lazy dog",
    "Tell me a long story about numbers and words and lions.",
]
PROMPTS = [render_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
MAX_TOKENS = 40


def greedy(max_tokens: int = MAX_TOKENS, **extra: Any) -> Sampling:
    return Sampling(max_tokens=max_tokens, temperature=0.0, **extra)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_dir(TINY, MODELS_DIR)  # builds the tiny model once, cached across runs


@pytest.fixture
def engine(model_dir: Path) -> LocalEngine:
    return LocalEngine(MODELS_DIR, max_adapters=8)


def plain_greedy(model_dir: Path, prompt: str, max_tokens: int, *, stop_at_end: bool = True) -> str:
    """The unbatched reference: one row, no mask, no padding, the model's own cache
    (``stop_at_end=False``: it runs to ``max_tokens`` through end tokens)."""
    import torch

    tok = load_tokenizer(str(model_dir))
    model = load_model(str(model_dir))
    model.eval()
    end = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")} if stop_at_end else set()
    ids, out, cache = tok.encode(prompt, add_special_tokens=False), [], None
    step = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(max_tokens):
            result = model(input_ids=step, use_cache=True, cache=cache)
            cache = result.cache
            token = int(result.logits[0, -1].argmax())
            if token in end:
                break
            out.append(token)
            step = torch.tensor([[token]])
    return str(tok.decode(out, skip_special_tokens=False))


def at_once(calls: list[Callable[[], Generation]]) -> list[Generation]:
    """Run every call in its own thread, released together."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Generation]) -> Generation:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_batched_greedy_equals_one_at_a_time(engine: LocalEngine, model_dir: Path) -> None:
    # How soon the tiny base says <|im_end|> depends on its build (the CPU's float arithmetic): rows
    # run to max_tokens instead, a different one each, so they still end at different times.
    engine._base(TINY).end_ids = set()
    lengths = [8 + 4 * i for i in range(len(PROMPTS))]
    alone = [engine.generate(TINY, None, p, greedy(n)) for p, n in zip(PROMPTS, lengths, strict=True)]
    assert max(engine.batch_sizes) == 1
    # prompts of different lengths (in tokens): the rows of a batch are left-padded
    assert len({engine.prompt_tokens(TINY, p) for p in PROMPTS}) == len(PROMPTS)
    assert [g.completion_tokens for g in alone] == lengths
    for prompt, generation, n in zip(PROMPTS, alone, lengths, strict=True):
        assert generation.text == plain_greedy(model_dir, prompt, n, stop_at_end=False)
    engine.batch_sizes.clear()

    batched = at_once([partial(engine.generate, TINY, None, p, greedy(n)) for p, n in zip(PROMPTS, lengths, strict=True)])

    assert max(engine.batch_sizes) >= 2, engine.batch_sizes  # the requests did share forward passes
    assert len(engine.batch_sizes) < sum(g.completion_tokens + 1 for g in alone)  # fewer passes than alone
    assert [(g.text, g.completion_tokens, g.finish_reason) for g in batched] == [
        (g.text, g.completion_tokens, g.finish_reason) for g in alone]


def test_streamed_pieces_add_up_to_the_text_in_a_batch(engine: LocalEngine) -> None:
    pieces: list[list[str]] = [[] for _ in PROMPTS]
    batched = at_once([partial(engine.generate, TINY, None, p, greedy(), pieces[i].append)
                       for i, p in enumerate(PROMPTS)])
    for got, generation in zip(pieces, batched, strict=True):
        assert "".join(got) == generation.text


def test_adapters_are_never_mixed(engine: LocalEngine, model_dir: Path, tmp_path: Path) -> None:
    a = Adapter("ckpt_a", str(random_lora(model_dir, tmp_path / "a", seed=11)))
    b = Adapter("ckpt_b", str(random_lora(model_dir, tmp_path / "b", seed=12)))
    prompts = PROMPTS[:4]
    engine._base(TINY).end_ids = set()  # full-length answers: a short one can be the same under two models
    alone = {(x.key if x else None, p): engine.generate(TINY, x, p, greedy()) for x in (None, a, b) for p in prompts}
    for p in prompts[:2]:  # each adapter changes the answers: serving the wrong one shows
        assert len({alone[(k, p)].text for k in (None, "ckpt_a", "ckpt_b")}) == 3, p

    calls = [(x, p) for p in prompts for x in (a, b, None, a)]
    batched = at_once([partial(engine.generate, TINY, x, p, greedy()) for x, p in calls])

    for (x, p), generation in zip(calls, batched, strict=True):
        assert generation.text == alone[(x.key if x else None, p)].text, (x, p)
    assert max(engine.batch_sizes[-200:]) >= 2  # same-adapter requests still batched together
    assert sorted(engine.loaded_adapters(TINY)) == ["ckpt_a", "ckpt_b"]


def test_a_cancelled_or_failing_reader_leaves_the_other_rows_intact(engine: LocalEngine) -> None:
    engine._base(TINY).end_ids = set()  # every row runs to its max_tokens unless ended otherwise
    alone = [engine.generate(TINY, None, p, greedy()) for p in PROMPTS]
    assert all(g.completion_tokens == MAX_TOKENS for g in alone)

    cancel = greedy()
    seen: list[str] = []

    def reader(piece: str) -> None:  # the client goes away after three pieces
        seen.append(piece)
        if len(seen) == 3:
            cancel.cancelled.set()

    def broken(piece: str) -> None:
        raise ConnectionResetError("the reader is gone")

    calls = [partial(engine.generate, TINY, None, p, greedy()) for p in PROMPTS]
    calls[2] = partial(engine.generate, TINY, None, PROMPTS[2], cancel, reader)
    calls[5] = partial(engine.generate, TINY, None, PROMPTS[5], greedy(), broken)
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Generation]) -> Generation | BaseException:
        barrier.wait()
        try:
            return call()
        except ConnectionResetError as err:
            return err

    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(run, calls))

    cancelled, failed = results[2], results[5]
    assert isinstance(cancelled, Generation) and cancelled.finish_reason == "cancelled"
    assert cancelled.completion_tokens == 3 and cancelled.text == "".join(seen)
    assert isinstance(failed, ConnectionResetError)
    for i, (got, want) in enumerate(zip(results, alone, strict=True)):
        if i not in (2, 5):
            assert isinstance(got, Generation)
            assert (got.text, got.completion_tokens, got.finish_reason) == (want.text, MAX_TOKENS, "length"), i

    # the model is free: a call after them is served to its end
    after = engine.generate(TINY, None, PROMPTS[0], greedy(max_tokens=5))
    assert after.completion_tokens == 5


def test_stop_sequences_and_max_tokens_hold_per_row(engine: LocalEngine) -> None:
    engine._base(TINY).end_ids = set()
    long = [engine.generate(TINY, None, p, greedy()) for p in PROMPTS]
    limits = [1, 2, 3, 5, 8, 13, 21, MAX_TOKENS]
    # each row stops at a sequence taken from the middle of its own uncut answer (none for the last)
    stops = [[g.text[len(g.text) // 2:len(g.text) // 2 + 2]] if i % 2 else [] for i, g in enumerate(long)]
    stops[-1] = []
    samplings = [greedy(max_tokens=MAX_TOKENS if s else n, stop=s) for n, s in zip(limits, stops, strict=True)]
    alone = [engine.generate(TINY, None, p, s) for p, s in zip(PROMPTS, samplings, strict=True)]

    batched = at_once([partial(engine.generate, TINY, None, p, s) for p, s in zip(PROMPTS, samplings, strict=True)])

    for i, (got, want, sampling) in enumerate(zip(batched, alone, samplings, strict=True)):
        assert (got.text, got.completion_tokens, got.finish_reason) == (want.text, want.completion_tokens,
                                                                         want.finish_reason), i
        if sampling.stop:
            assert got.finish_reason == "stop" and sampling.stop[0] not in got.text, i
            assert long[i].text.startswith(got.text) and len(got.text) < len(long[i].text), i
        else:
            assert got.finish_reason == "length" and got.completion_tokens == sampling.max_tokens, i


def test_seeded_sampling_is_the_same_in_a_batch(engine: LocalEngine) -> None:
    samplings = [Sampling(max_tokens=24, temperature=1.0, top_p=0.9, seed=100 + i) for i in range(len(PROMPTS))]
    alone = [engine.generate(TINY, None, p, s) for p, s in zip(PROMPTS, samplings, strict=True)]
    again = [Sampling(max_tokens=24, temperature=1.0, top_p=0.9, seed=100 + i) for i in range(len(PROMPTS))]
    batched = at_once([partial(engine.generate, TINY, None, p, s) for p, s in zip(PROMPTS, again, strict=True)])
    assert [g.text for g in batched] == [g.text for g in alone]


def test_usage_through_the_api_is_the_same_batched(gym: Any) -> None:
    service = gym.service_apps["inference"].state.inference
    local: LocalEngine = service.engine.engines["local"]
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as admin:
        key = create_key(admin, budget_usd=5.0)
        headers = {"Authorization": f"Bearer {key['key']}"}

        def call(question: str, stream: bool = False) -> dict[str, Any]:
            body = {"model": "tiny", "messages": [{"role": "user", "content": question}], "temperature": 0,
                    "max_tokens": MAX_TOKENS, "stream": stream, "stream_options": {"include_usage": True}}
            with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
                if not stream:
                    r = client.post("/inference/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
                    data = r.json()
                    return {"text": data["choices"][0]["message"]["content"], "usage": data["usage"]}
                text, usage = "", None
                with client.stream("POST", "/inference/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    import json

                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            chunk = json.loads(line[6:])
                            for choice in chunk["choices"]:
                                text += choice["delta"].get("content") or ""
                            usage = chunk.get("usage") or usage
                return {"text": text, "usage": usage}

        alone = [call(q) for q in QUESTIONS]
        spent_before = admin.get("/v1/balance", headers=headers).json()["spent_usd"]
        local.batch_sizes.clear()
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            batched = list(pool.map(lambda iq: call(iq[1], stream=iq[0] % 2 == 1), enumerate(QUESTIONS)))
        spent_after = admin.get("/v1/balance", headers=headers).json()["spent_usd"]

    assert max(local.batch_sizes) >= 2, local.batch_sizes
    assert batched == alone
    alone_cost = sum(a["usage"]["cost_usd"] for a in alone)
    assert spent_after - spent_before == pytest.approx(alone_cost, abs=1e-9)


def test_min_tokens_holds_back_the_end_of_its_own_rows_only(engine: LocalEngine) -> None:
    """``min_tokens`` (vLLM's parameter): a row so asked generates no end token before that many
    tokens; the other rows of the same batch end where they always do."""
    normal = [engine.generate(TINY, None, p, greedy()) for p in PROMPTS]
    assert any(g.finish_reason == "stop" for g in normal)  # the model does end some answers early
    samplings = [greedy(min_tokens=MAX_TOKENS) if i % 2 else greedy() for i in range(len(PROMPTS))]
    batched = at_once([partial(engine.generate, TINY, None, p, s) for p, s in zip(PROMPTS, samplings, strict=True)])
    for i, got in enumerate(batched):
        if i % 2:
            assert (got.completion_tokens, got.finish_reason) == (MAX_TOKENS, "length"), i
            assert got.text.startswith(normal[i].text), i  # the same answer, then on past its end
        else:
            assert (got.text, got.finish_reason) == (normal[i].text, normal[i].finish_reason), i


def test_min_tokens_through_the_api_and_its_bad_values(gym: Any) -> None:
    with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=120) as admin:
        key = create_key(admin, budget_usd=5.0)
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key['key']}"}) as client:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "What is 3 + 4?"}], "temperature": 0,
                    "max_tokens": 12}
            r = client.post("/inference/v1/chat/completions", json={**body, "min_tokens": 12})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 12 and r.json()["choices"][0]["finish_reason"] == "length"
            spent = admin.get("/v1/balance", headers=client.headers).json()["spent_usd"]
            for bad in (13, -1, "4", True, 2.5):
                r = client.post("/inference/v1/chat/completions", json={**body, "min_tokens": bad})
                assert r.status_code == 422, (bad, r.text)
                assert r.json()["error"]["param"] == "min_tokens", r.text
            assert admin.get("/v1/balance", headers=client.headers).json()["spent_usd"] == spent  # refusals cost nothing
