"""The Tinker training-loop engine (services/training/loop/) on the real tiny model, on CPU.

Losses are checked against values computed by hand from the base model's own log-probabilities
(a fresh LoRA adapter computes exactly the base model: its B matrices start at zero); gradient
accumulation, state round trips and saved adapters against a second session; and the engine
learns: a GRPO-style loop (a group of 8 samples per prompt, advantage = reward - group mean,
``importance_sampling``) raises an easy reward within 10 steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kit.config import BaseModel_
from kit.errors import Conflict, NotFound, Unprocessable
from services.inference.backends.base import Adapter, Sampling
from services.inference.backends.local import LocalEngine
from services.models.loading import load_model, resolve_model_dir
from services.training.loop.session import STATE_FILE, LoopSession
from services.training.loop.types import AdamParams, Datum, SamplingParams
from tests.conftest import MODELS_DIR
from tests.fakes.tiny_lora import torch_threads

TINY = BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=1.0, prefill_usd_per_mtok=0.1, sample_usd_per_mtok=0.1)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def base_path() -> Path:
    return resolve_model_dir(TINY, MODELS_DIR)  # builds the tiny model once, cached across runs


@pytest.fixture(scope="module")
def session(base_path: Path) -> LoopSession:
    """A session that is never stepped: its weights stay the base model's."""
    return LoopSession(base_path=base_path, rank=8, seed=0)


def encode(session: LoopSession, text: str) -> list[int]:
    return list(session._m.tokenizer.encode(text, add_special_tokens=False))


def shifted(full: list[int], **inputs: list[float]) -> Datum:
    """Tinker's datum for a whole sequence: inputs all but the last token, targets shifted by one."""
    return Datum(full[:-1], {"target_tokens": full[1:], **inputs})


def base_logprobs(base_path: Path, full: list[int]) -> list[float]:
    """log p(full[i+1] | full[:i+1]) under the base model, computed here without the engine."""
    model = load_model(str(base_path)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full[:-1]])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(full[1:]).unsqueeze(-1)).squeeze(-1).tolist()


def params_of(session: LoopSession) -> list[torch.Tensor]:
    return [p.detach().clone() for p in session.params]


# -- losses against hand-computed values --------------------------------------------------------


def test_cross_entropy_is_the_weighted_sum_of_target_logprobs(session: LoopSession, base_path: Path) -> None:
    full = encode(session, "Count: 1 2 3 4 5")
    expected = base_logprobs(base_path, full)
    n = len(full) - 1
    weights = [0.0] * 4 + [1.0] * (n - 4)  # the "prompt" masked out

    result = session.forward([shifted(full, weights=weights)], "cross_entropy")

    assert result.loss_fn_outputs[0]["logprobs"] == pytest.approx(expected, abs=1e-5)
    hand = -sum(w * lp for w, lp in zip(weights, expected, strict=True))
    assert result.metrics["loss:sum"] == pytest.approx(hand, rel=1e-5)
    # Without weights every position counts (the SDK's own forward example sends none).
    unweighted = session.forward([shifted(full)], "cross_entropy")
    assert unweighted.metrics["loss:sum"] == pytest.approx(-sum(expected), rel=1e-5)
    # A sum over data, not a mean: two copies cost twice one.
    twice = session.forward([shifted(full, weights=weights)] * 2, "cross_entropy")
    assert twice.metrics["loss:sum"] == pytest.approx(2 * hand, rel=1e-5)


def test_importance_sampling_on_policy_is_minus_the_sum_of_advantages(session: LoopSession) -> None:
    full = encode(session, "Numbers: 40 51 62")
    current = session.forward([shifted(full)], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    advantages = [0.5 * (i % 3) - 0.4 for i in range(len(current))]

    result = session.forward([shifted(full, logprobs=current, advantages=advantages)], "importance_sampling")

    assert result.metrics["loss:sum"] == pytest.approx(-sum(advantages), abs=1e-4)
    # Off policy the ratio weighs each advantage: sampled twice as likely → half the weight.
    halved = [lp + math.log(2) for lp in current]
    off = session.forward([shifted(full, logprobs=halved, advantages=advantages)], "importance_sampling")
    assert off.metrics["loss:sum"] == pytest.approx(-0.5 * sum(advantages), abs=1e-4)


def test_ppo_clips_the_ratio_outside_its_band(session: LoopSession) -> None:
    full = encode(session, "hello world 12")
    current = session.forward([shifted(full)], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    n = len(current)
    # Ratios 2, 0.5, 0.5, 2 with advantages +1, +1, -1, -1; the other positions weigh nothing.
    shift = [-math.log(2), math.log(2), math.log(2), -math.log(2)] + [0.0] * (n - 4)
    sampling = [lp + s for lp, s in zip(current, shift, strict=True)]
    advantages = [1.0, 1.0, -1.0, -1.0] + [0.0] * (n - 4)
    datum = shifted(full, logprobs=sampling, advantages=advantages)

    default = session.forward([datum], "ppo")  # band [0.8, 1.2]
    # -min(r*A, clip(r)*A): -min(2, 1.2) - min(0.5, 0.8) - min(-0.5, -0.8) - min(-2, -1.2)
    assert default.metrics["loss:sum"] == pytest.approx(-1.2 - 0.5 + 0.8 + 2.0, abs=1e-4)
    tight = session.forward([datum], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    assert tight.metrics["loss:sum"] == pytest.approx(-1.1 - 0.5 + 0.9 + 2.0, abs=1e-4)
    cispo = session.forward([datum], "cispo")  # -(clip(r, 0, 4) * A * logp), r not clipped here
    hand = -sum(r * a * lp for r, a, lp in zip([2, 0.5, 0.5, 2], advantages, current, strict=False))
    assert cispo.metrics["loss:sum"] == pytest.approx(hand, rel=1e-4)


def test_a_clipped_ppo_token_has_no_gradient(base_path: Path) -> None:
    s = LoopSession(base_path=base_path, rank=4, seed=1)
    full = encode(s, "red lion 7")
    current = s.forward([shifted(full)], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    n = len(current)
    clipped = shifted(full, logprobs=[lp - math.log(2) for lp in current], advantages=[1.0] + [0.0] * (n - 1))
    s.forward_backward([clipped], "ppo")
    assert all(p.grad is None or not p.grad.any() for p in s.params)
    inside = shifted(full, logprobs=list(current), advantages=[1.0] + [0.0] * (n - 1))
    s.forward_backward([inside], "ppo")
    assert any(p.grad is not None and p.grad.any() for p in s.params)


def test_bad_requests_are_refused_naming_the_field(session: LoopSession) -> None:
    full = encode(session, "Count: 1 2 3")
    n = len(full) - 1
    rl = {"logprobs": [0.0] * n, "advantages": [0.0] * n}
    cases = [
        (lambda: session.forward([shifted(full)], "dpo"), "loss_fn"),
        (lambda: session.forward([shifted(full, logprobs=[0.0] * n)], "importance_sampling"),
         "loss_fn_inputs.advantages"),
        (lambda: session.forward([shifted(full, weights=[1.0] * (n - 1))], "cross_entropy"), "loss_fn_inputs.weights"),
        (lambda: session.forward([shifted(full, mask=[1.0] * n)], "cross_entropy"), "loss_fn_inputs.mask"),
        (lambda: session.forward([shifted(full, **rl)], "ppo", {"clip": 0.2}), "loss_fn_config.clip"),
        (lambda: session.forward([shifted(full, **rl)], "importance_sampling", {"clip_low_threshold": 0.8}),
         "loss_fn_config.clip_low_threshold"),
        (lambda: session.forward([Datum([10**6], {"target_tokens": [1]})], "cross_entropy"), "model_input"),
        (lambda: session.forward([Datum([1] * 300, {"target_tokens": [1] * 300})], "cross_entropy"), "model_input"),
        (lambda: session.forward([], "cross_entropy"), "data"),
    ]
    for call, param in cases:
        with pytest.raises(Unprocessable) as err:
            call()
        assert err.value.param == param, err.value.message


# -- forward, accumulation, optimizer -----------------------------------------------------------


def test_forward_matches_forward_backward_and_computes_no_gradient(base_path: Path) -> None:
    s = LoopSession(base_path=base_path, rank=4, seed=2)
    data = [shifted(encode(s, text)) for text in ("Count: 1 2 3", "a longer line of words 5 6 7 8")]  # padded batch

    forward = s.forward(data, "cross_entropy")
    assert all(p.grad is None for p in s.params)
    backward = s.forward_backward(data, "cross_entropy")

    assert forward.loss_fn_outputs == backward.loss_fn_outputs
    assert forward.metrics == backward.metrics
    assert all(p.grad is not None for p in s.params)
    assert [len(o["logprobs"]) for o in forward.loss_fn_outputs] == [len(d.tokens) for d in data]
    # Padding changes nothing: each datum alone gives its own log-probabilities.
    for datum, out in zip(data, forward.loss_fn_outputs, strict=True):
        assert s.forward([datum], "cross_entropy").loss_fn_outputs[0]["logprobs"] == pytest.approx(
            out["logprobs"], abs=1e-5)


def test_two_forward_backwards_then_one_step_equal_one_call_on_both(base_path: Path) -> None:
    a = LoopSession(base_path=base_path, rank=4, seed=3)
    b = LoopSession(base_path=base_path, rank=4, seed=3)
    tokens = encode(a, "Count: 1 2 3")
    first = [shifted(tokens, weights=[0.0, 0.0] + [1.0] * (len(tokens) - 3))]
    second = [shifted(encode(a, "Numbers: 40 51 62"))]
    adam = AdamParams(learning_rate=1e-2)

    a.forward_backward(first, "cross_entropy")
    a.forward_backward(second, "cross_entropy")
    a.optim_step(adam)
    b.forward_backward(first + second, "cross_entropy")
    b.optim_step(adam)

    for pa, pb in zip(params_of(a), params_of(b), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)
    assert all(p.grad is None for p in a.params)  # optim_step cleared them


def test_custom_loss_gives_the_built_in_gradient(base_path: Path) -> None:
    a = LoopSession(base_path=base_path, rank=4, seed=4)
    b = LoopSession(base_path=base_path, rank=4, seed=4)
    full = encode(a, "hello world 12")
    weights = [0.5] * (len(full) - 1)

    built_in = a.forward_backward([shifted(full, weights=weights)], "cross_entropy")
    custom = b.forward_backward_custom(
        [shifted(full, weights=weights)],
        lambda data, logprobs: (-(torch.tensor(weights) * logprobs[0]).sum(), {"custom:mean": 1.0}))

    assert custom.metrics["loss:sum"] == pytest.approx(built_in.metrics["loss:sum"], rel=1e-5)
    assert custom.metrics["custom:mean"] == 1.0
    for pa, pb in zip(a.params, b.params, strict=True):
        assert pa.grad is not None and pb.grad is not None
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6)


def test_grad_clip_and_optimizer_metrics(base_path: Path) -> None:
    s = LoopSession(base_path=base_path, rank=4, seed=5)
    s.forward_backward([shifted(encode(s, "Count: 1 2 3"))], "cross_entropy")
    metrics = s.optim_step(AdamParams(learning_rate=1e-3, grad_clip_norm=1e-3))
    assert metrics["grad_norm:mean"] > 1e-3  # the norm before clipping
    assert metrics["optim_step:max"] == 1.0


# -- weights and state --------------------------------------------------------------------------


def trained(base_path: Path, seed: int, steps: int = 2) -> LoopSession:
    s = LoopSession(base_path=base_path, rank=4, seed=seed)
    for _ in range(steps):
        s.forward_backward([shifted(encode(s, "Count: 1 2 3 4"))], "cross_entropy")
        s.optim_step(AdamParams(learning_rate=1e-2, weight_decay=0.01))
    return s


def test_save_and_load_state_round_trip(base_path: Path, tmp_path: Path) -> None:
    probe = [shifted([5, 60, 70, 80, 90, 100])]
    source = trained(base_path, seed=6)
    source.save_state(tmp_path / "state")
    assert (tmp_path / "state" / STATE_FILE).is_file()

    restored = LoopSession(base_path=base_path, rank=4, seed=99)  # other init: everything must come from disk
    restored.load_state(tmp_path / "state")

    assert (restored.forward(probe, "cross_entropy").loss_fn_outputs
            == source.forward(probe, "cross_entropy").loss_fn_outputs)
    moments = [(st["exp_avg"], st["exp_avg_sq"]) for st in restored.optimizer.state_dict()["state"].values()]
    expected = [(st["exp_avg"], st["exp_avg_sq"]) for st in source.optimizer.state_dict()["state"].values()]
    assert len(moments) == len(expected) > 0
    assert all(torch.equal(m[0], e[0]) and torch.equal(m[1], e[1]) for m, e in zip(moments, expected, strict=True))
    # The next step is the same on both: AdamW's moments and step counts came back.
    for s in (source, restored):
        s.forward_backward(probe, "cross_entropy")
        s.optim_step(AdamParams(learning_rate=1e-2, weight_decay=0.01))
    for pa, pb in zip(params_of(source), params_of(restored), strict=True):
        assert torch.equal(pa, pb)
    assert restored.steps == source.steps == 3
    # The sampling RNG came back too: unseeded draws agree.
    prompt = encode(source, "Count: 1 2")
    unseeded = SamplingParams(max_tokens=6, stop=[])
    assert [q.tokens for q in restored.sample(prompt, 4, unseeded)] == [q.tokens for q in source.sample(prompt, 4, unseeded)]


def test_load_state_without_optimizer_starts_it_fresh(base_path: Path, tmp_path: Path) -> None:
    source = trained(base_path, seed=7)
    source.save_weights_for_sampler(tmp_path / "weights")
    other = LoopSession(base_path=base_path, rank=4, seed=8)

    with pytest.raises(NotFound):
        other.load_state(tmp_path / "weights")  # weights only: no optimizer state to restore
    other.load_state(tmp_path / "weights", with_optimizer=False)

    assert other.optimizer.state_dict()["state"] == {}
    probe = [shifted([5, 60, 70, 80])]
    assert other.forward(probe, "cross_entropy").loss_fn_outputs == source.forward(probe, "cross_entropy").loss_fn_outputs
    with pytest.raises(Conflict):
        LoopSession(base_path=base_path, rank=8, seed=0).load_state(tmp_path / "weights", with_optimizer=False)


def test_saved_weights_are_a_peft_adapter_the_sampler_and_inference_serve(base_path: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    source = trained(base_path, seed=9, steps=4)
    adapter = tmp_path / "sampler"
    source.save_weights_for_sampler(adapter)
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}

    full = encode(source, "Count: 1 2 3 4 5")
    model = PeftModel.from_pretrained(load_model(str(base_path)), str(adapter)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full[:-1]])).logits[0].float()
    peft_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(full[1:]).unsqueeze(-1)).squeeze(-1).tolist()
    assert source.forward([shifted(full)], "cross_entropy").loss_fn_outputs[0]["logprobs"] == pytest.approx(
        peft_lp, abs=1e-5)

    prompt = encode(source, "<|im_start|>user\nCount: 1 2 3<|im_end|>\n<|im_start|>assistant\n")
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    sampler = LoopSession.load_sampler(base_path, adapter)
    from_sampler = sampler.sample(prompt, 1, greedy)[0]
    assert from_sampler.tokens == source.sample(prompt, 1, greedy)[0].tokens
    # The sampled tokens' log-probabilities are the trainer's: on-policy importance ratios are 1.
    scored = source.forward([shifted(prompt + from_sampler.tokens)], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    assert scored[len(prompt) - 1:] == pytest.approx(from_sampler.logprobs, abs=1e-4)
    # The gym's inference serves the same adapter and answers the same.
    engine = LocalEngine(MODELS_DIR, max_adapters=2)
    text = source._m.tokenizer.decode(prompt, skip_special_tokens=False)
    served = engine.generate(TINY, Adapter("loop_ckpt", str(adapter)), text, Sampling(max_tokens=12, temperature=0.0))
    answer = [t for t in from_sampler.tokens if t not in source._m.eos_ids]
    assert served.text.strip() == source._m.tokenizer.decode(answer, skip_special_tokens=True).strip()


# -- sampling -----------------------------------------------------------------------------------


def test_sampling_seeds_stops_and_budgets(session: LoopSession) -> None:
    prompt = encode(session, "Count: 1 2 3")
    seeded = SamplingParams(max_tokens=8, seed=11, stop=[])
    first, again = session.sample(prompt, 4, seeded), session.sample(prompt, 4, seeded)
    assert [s.tokens for s in first] == [s.tokens for s in again]
    assert all(len(s.tokens) == 8 and s.stop_reason == "length" and len(s.logprobs) == 8 for s in first)
    assert len({tuple(s.tokens) for s in session.sample(prompt, 8, SamplingParams(max_tokens=8, seed=12))}) > 1

    greedy = session.sample(prompt, 1, SamplingParams(max_tokens=6, temperature=0.0, stop=[]))[0]
    assert session.sample(prompt, 2, SamplingParams(max_tokens=6, top_k=1, stop=[], seed=3))[0].tokens == greedy.tokens
    assert session.sample(prompt, 1, SamplingParams(max_tokens=6, top_p=1e-6, stop=[], seed=4))[0].tokens == greedy.tokens

    stop_at = greedy.tokens[2]
    stopped = session.sample(prompt, 1, SamplingParams(max_tokens=6, temperature=0.0, stop=[stop_at]))[0]
    assert stopped.stop_reason == "stop" and stopped.tokens == greedy.tokens[:greedy.tokens.index(stop_at) + 1]
    text = session._m.tokenizer.decode(greedy.tokens[:3], skip_special_tokens=False)
    by_text = session.sample(prompt, 1, SamplingParams(max_tokens=6, temperature=0.0, stop=[text[-1]]))[0]
    assert by_text.stop_reason == "stop" and len(by_text.tokens) <= 3

    room = session._m.max_positions - len(prompt)
    assert len(session.sample(prompt, 1, SamplingParams(max_tokens=10_000, stop=[], seed=1))[0].tokens) == room
    with pytest.raises(Unprocessable):
        session.sample([1] * session._m.max_positions, 1, SamplingParams(max_tokens=4))
    with pytest.raises(Unprocessable):
        session.sample(prompt, 0, SamplingParams(max_tokens=4))


def test_tokens_are_metered(base_path: Path) -> None:
    s = LoopSession(base_path=base_path, rank=4, seed=10)
    datum = shifted(encode(s, "Count: 1 2 3"))
    s.forward([datum], "cross_entropy")
    s.forward_backward([datum, datum], "cross_entropy")
    out = s.sample(datum.tokens, 2, SamplingParams(max_tokens=3, stop=[], seed=0))
    assert (s.meter.forward, s.meter.train, s.meter.prefill) == (len(datum.tokens), 2 * len(datum.tokens),
                                                                 2 * len(datum.tokens))
    assert s.meter.sampled == sum(len(o.tokens) for o in out) == 6
    assert s.tokens_seen() == s.meter.total()
    s.close()
    with pytest.raises(Conflict):
        s.forward([datum], "cross_entropy")


# -- the engine learns --------------------------------------------------------------------------


def test_grpo_style_loop_raises_an_easy_reward(base_path: Path) -> None:
    """Reward: the fraction of sampled tokens that are "1". Two prompts, 8 samples each per step,
    advantage = reward - the group's mean, one importance_sampling step per batch."""
    s = LoopSession(base_path=base_path, rank=8, seed=0)
    target = encode(s, "1")[0]
    prompts = [encode(s, "Count: 1 2 3"), encode(s, "Numbers: 40 51")]
    curve = []
    for step in range(10):
        data, rewards = [], []
        for k, prompt in enumerate(prompts):
            group = s.sample(prompt, 8, SamplingParams(max_tokens=8, stop=[], seed=1000 * step + k))
            scores = [sum(t == target for t in seq.tokens) / len(seq.tokens) for seq in group]
            mean = sum(scores) / len(scores)
            rewards += scores
            for seq, score in zip(group, scores, strict=True):
                pad = [0.0] * (len(prompt) - 1)  # prompt positions: no advantage, no loss
                data.append(shifted(prompt + seq.tokens, logprobs=pad + seq.logprobs,
                                    advantages=pad + [score - mean] * len(seq.tokens)))
        s.forward_backward(data, "importance_sampling")
        s.optim_step(AdamParams(learning_rate=1e-2))
        curve.append(sum(rewards) / len(rewards))
    print("mean reward per step:", [round(r, 3) for r in curve])
    assert max(curve[:2]) < 0.2
    assert sum(curve[-3:]) / 3 > 0.6
