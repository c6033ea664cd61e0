"""A LoRA with other settings than its parent checkpoint's stacks on it (services/training/backends/lora_stack.py).

The stacked checkpoint is ONE standard adapter (the parent's and the new one concatenated along
the rank), so inference serves it unchanged; its outputs must be those of the base with the
parent's adapter merged in plus the new adapter, to float rounding. A job whose settings match
the parent's adapter still continues that adapter.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import rsigym
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import build_embedded
from services.models.chat_format import IM_END, render_prompt
from services.models.loading import load_model, load_tokenizer, resolve_model_dir
from services.models.synthetic import subtraction
from services.training.backends.lora_stack import StackedAdapter
from services.training.checkpoints import Checkpoint
from storage.tables import RunGeneration
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, admin_headers
from tests.fakes.servers import serve_gym
from tests.fakes.tiny_lora import torch_threads

PARENT_LORA: dict[str, Any] = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
CHILD_LORA: dict[str, Any] = {"rank": 4, "alpha": 4, "target_modules": ["down_proj", "q_proj"]}
QUESTIONS = ["What is 57 - 19?", "What is 30 - 4?", "Repeat: red lion"]
JOB: dict[str, Any] = {"steps": 4, "learning_rate": 2e-2, "batch_size": 4, "max_length": 64, "seed": 5}


def logits_of(model: Any, tokenizer: Any) -> Any:
    import torch

    ids = [tokenizer.encode(render_prompt([{"role": "user", "content": q}]), add_special_tokens=False)
           for q in QUESTIONS]
    with torch.no_grad():
        return [model(input_ids=torch.tensor([i])).logits[0] for i in ids]


def max_gap(a: list[Any], b: list[Any]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def exact_stack(model_dir: Path, parent_dir: str, child_dir: str) -> Any:
    """base + Δparent + Δchild: both adapters loaded as they were saved, both active, nothing merged."""
    from peft import PeftModel

    both = PeftModel.from_pretrained(load_model(str(model_dir)), parent_dir, adapter_name="parent")
    both.load_adapter(child_dir, adapter_name="child")
    both.base_model.set_adapter(["parent", "child"])
    return both.eval()


def split_new_adapter(stacked: dict[str, Any], out: Path) -> Path:
    """The new adapter alone, out of a stacked checkpoint of ranks 8 + 4 (its rows/columns after the
    parent's; its scaling, alpha 4 / rank 4 = 1, is the stacked adapter's)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    alpha: Any = CHILD_LORA["alpha"]
    LoraConfig(r=4, lora_alpha=alpha, target_modules=CHILD_LORA["target_modules"],
               task_type="CAUSAL_LM").save_pretrained(str(out))
    mine = {k: (v[8:] if "lora_A" in k else v[:, 8:]).contiguous() for k, v in stacked.items()
            if any(f".{m}." in k for m in CHILD_LORA["target_modules"])}
    save_file(mine, str(out / "adapter_model.safetensors"))
    return out


def served(model_dir: Path, adapter_dir: str) -> Any:
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model(str(model_dir)), adapter_dir).eval()


def greedy(model: Any, tokenizer: Any, question: str, max_tokens: int = 12) -> str:
    import torch

    ids = tokenizer.encode(render_prompt([{"role": "user", "content": question}]), add_special_tokens=False)
    stops = {tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id}
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt in stops:
                break
            out.append(nxt)
    return str(tokenizer.decode(out, skip_special_tokens=True))


def test_the_concatenation_is_the_exact_stack_of_two_random_adapters(tmp_path: Path) -> None:
    """Random, non-zero adapters with different ranks, alphas, rsLoRA and targets (some shared, some not)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model_dir = resolve_model_dir_tiny()
    tokenizer = load_tokenizer(str(model_dir))
    with torch_threads(1):
        torch.manual_seed(11)
        parent = get_peft_model(load_model(str(model_dir)), LoraConfig(
            r=8, lora_alpha=16, init_lora_weights=False, target_modules=["q_proj", "v_proj", "up_proj"]))
        parent.save_pretrained(str(tmp_path / "parent"))
        parent_config = LoraConfig.from_pretrained(str(tmp_path / "parent"))
        merged = parent.merge_and_unload()
        merged.__dict__.pop("peft_config", None)
        child_alpha: Any = 3
        child_config = LoraConfig(r=4, lora_alpha=child_alpha, use_rslora=True, init_lora_weights=False,
                                  target_modules=["down_proj", "q_proj"])
        child = get_peft_model(merged, child_config).eval()
        with torch.no_grad():
            for name, param in child.named_parameters():
                if "lora_B" in name:
                    param.mul_(5.0)
        child.save_pretrained(str(tmp_path / "child"))
        merged_then_child = logits_of(child, tokenizer)  # how a stacked job trains
        StackedAdapter(str(tmp_path / "parent"), parent_config, child, child_config, {}).save_pretrained(
            tmp_path / "stacked")
        stacked = logits_of(served(model_dir, str(tmp_path / "stacked")), tokenizer)
        reference = logits_of(exact_stack(model_dir, str(tmp_path / "parent"), str(tmp_path / "child")), tokenizer)
        parent_only = logits_of(served(model_dir, str(tmp_path / "parent")), tokenizer)

    config = json.loads((tmp_path / "stacked" / "adapter_config.json").read_text())
    assert config["r"] == 12 and config["lora_alpha"] == 12
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "up_proj", "v_proj"]
    assert max_gap(stacked, reference) < 1e-5
    # Training saw the parent merged into the weights: the same sum, rounded once more.
    assert max_gap(merged_then_child, reference) < 1e-4
    assert max_gap(parent_only, reference) > 1e-2  # the new adapter counts: dropping it shows


def resolve_model_dir_tiny() -> Path:
    from kit.config import BaseModel_

    return resolve_model_dir(BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=0, prefill_usd_per_mtok=0,
                                        sample_usd_per_mtok=0), MODELS_DIR)


# -- through the gym: training jobs, the registry, inference --------------------------------------


class Live:
    def __init__(self, url: str, gym: Any):
        self.url, self.gym = url, gym

    def key(self) -> dict[str, Any]:
        import httpx

        r = httpx.post(f"{self.url}/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0},
                       headers=admin_headers(), timeout=60)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def sdk(self, key: dict[str, Any]) -> rsigym.Gym:
        return rsigym.Gym(base_url=self.url, api_key=key["key"], timeout=120)

    def checkpoint(self, ckpt_id: str) -> Checkpoint:
        with self.gym.gateway.store.transaction() as s:
            row = s.get(Checkpoint, ckpt_id)
            assert row is not None
            return row



@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data = tmp_path_factory.mktemp("gym")
    gym = build_embedded(GymSettings(data_dir=data, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR),
                         provider_secrets=ProviderSecrets({}), run_reaper=False)
    with serve_gym(gym) as url:
        yield Live(url, gym)
    gym.service_apps["training"].state.training.runner.shutdown()


@pytest.fixture(scope="module")
def parent(live: Live) -> dict[str, Any]:
    """A run's checkpoint: a rank-8 LoRA on q_proj and v_proj."""
    key = live.key()
    gym = live.sdk(key)
    rng = random.Random(3)
    dataset = gym.training.upload_dataset([{"messages": subtraction(rng)} for _ in range(64)], name="subtraction")
    job = gym.training.wait(gym.training.create_job(datasets=[dataset.id], base_model="tiny", lora=PARENT_LORA,
                                                    **JOB).id, timeout=600, poll=1)
    assert job.status == "succeeded", (job.status, job.error)
    return {"key": key, "gym": gym, "dataset": dataset.id, "checkpoint": job.checkpoints[-1]}


def train(gym: rsigym.Gym, dataset: str, ckpt: str, lora: dict[str, Any]) -> Any:
    job = gym.training.wait(gym.training.create_job(datasets=[dataset], parent_checkpoint=ckpt, lora=lora, **JOB).id,
                            timeout=600, poll=1)
    assert job.status == "succeeded", (job.status, job.error)
    return job


def test_a_job_with_other_lora_settings_stacks_a_new_adapter_that_inference_serves(
        live: Live, parent: dict[str, Any], tmp_path: Path) -> None:
    gym, parent_ckpt = parent["gym"], parent["checkpoint"]
    job = train(gym, parent["dataset"], parent_ckpt, CHILD_LORA)
    ckpt = live.checkpoint(job.checkpoints[-1])
    parent_row = live.checkpoint(parent_ckpt)

    # Lineage unchanged; the record says what was stacked on what.
    assert ckpt.parent_checkpoint_id == parent_ckpt
    stacked = ckpt.metrics["stacked"]
    assert stacked["on"] == parent_ckpt
    assert (stacked["parent_lora"]["rank"], stacked["parent_lora"]["target_modules"]) == (8, ["q_proj", "v_proj"])
    assert (stacked["lora"]["rank"], stacked["lora"]["target_modules"]) == (4, ["down_proj", "q_proj"])
    assert job.config["lora"]["rank"] == 4
    config = json.loads((Path(ckpt.path) / "adapter_config.json").read_text())
    assert config["r"] == 12 and sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]

    # The parent's adapter is in it bit for bit (scaled into B), the new one where the parent has nothing.
    from safetensors.torch import load_file

    weights = load_file(str(Path(ckpt.path) / "adapter_model.safetensors"))
    parent_weights = load_file(str(Path(parent_row.path) / "adapter_model.safetensors"))
    for key, a1 in parent_weights.items():
        if "lora_A" in key:
            b_key = key.replace("lora_A", "lora_B")
            assert bool((weights[key][:8] == a1).all())
            assert bool((weights[b_key][:, :8] == parent_weights[b_key] * 2.0).all())  # alpha 16 / rank 8
    assert all(bool((weights[k][:, 8:] == 0).all()) for k in weights if "v_proj.lora_B" in k)  # not a new target
    assert all(bool((weights[k][:, :8] == 0).all()) for k in weights if "down_proj.lora_B" in k)  # not the parent's
    assert any(float(weights[k][:, 8:].abs().max()) > 0 for k in weights if "down_proj.lora_B" in k)  # it trained

    # Its outputs are base + Δparent + Δnew: the two adapters, both active, nothing merged.
    model_dir = resolve_model_dir_tiny()
    tokenizer = load_tokenizer(str(model_dir))
    child_dir = split_new_adapter(weights, tmp_path / "new-alone")
    with torch_threads(1):
        reference = exact_stack(model_dir, parent_row.path, str(child_dir))
        ref_logits = logits_of(reference, tokenizer)
        assert max_gap(logits_of(served(model_dir, ckpt.path), tokenizer), ref_logits) < 1e-5
        assert max_gap(logits_of(served(model_dir, parent_row.path), tokenizer), ref_logits) > 1e-3  # it trained
        expected = [greedy(reference, tokenizer, q) for q in QUESTIONS]

    # Served by the inference service as any checkpoint is, answering as the exact stack does.
    answers = [gym.inference.chat(model=ckpt.id, messages=[{"role": "user", "content": q}], max_tokens=12,
                                  temperature=0).choices[0].message.content or "" for q in QUESTIONS]
    assert [a.strip() for a in answers] == [e.strip() for e in expected]


def test_matching_settings_continue_the_parent_adapter(live: Live, parent: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    job = train(parent["gym"], parent["dataset"], parent["checkpoint"], PARENT_LORA)
    ckpt, parent_row = live.checkpoint(job.checkpoints[-1]), live.checkpoint(parent["checkpoint"])
    assert "stacked" not in ckpt.metrics and ckpt.parent_checkpoint_id == parent_row.id
    assert json.loads((Path(ckpt.path) / "adapter_config.json").read_text())["r"] == 8
    before = load_file(str(Path(parent_row.path) / "adapter_model.safetensors"))
    after = load_file(str(Path(ckpt.path) / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    moved = [k for k in before if "lora_A" in k and not bool((before[k] == after[k]).all())]
    assert moved  # the parent's own A matrices trained on: a continuation, not a fresh adapter


def test_a_granted_initial_checkpoint_stacks_instead_of_refusing(live: Live, parent: dict[str, Any]) -> None:
    """The --from grant (a ``run_generations`` row): another run trains its own LoRA settings on
    the initial checkpoint — before, a 422; now a stacked adapter of rank 8 + 4."""
    gen2 = live.key()
    with live.gym.gateway.store.transaction() as s:
        parent_row = s.get(Checkpoint, parent["checkpoint"])
        assert parent_row is not None
        s.add(RunGeneration(run_id=gen2["id"], from_run_id=parent["key"]["id"], chain_root_id=parent["key"]["id"],
                            generation=2, submission_id="sub_x", audit_id="aud_x", initial_model=parent_row.id,
                            initial_harness="minimal", initial_weights_hash=parent_row.weights_hash,
                            base_model="tiny"))
    gym = live.sdk(gen2)
    rng = random.Random(9)
    dataset = gym.training.upload_dataset([{"messages": subtraction(rng)} for _ in range(32)], name="more").id
    job = train(gym, dataset, parent["checkpoint"], CHILD_LORA)
    ckpt = live.checkpoint(job.checkpoints[-1])
    assert ckpt.run_id == gen2["id"] and ckpt.parent_checkpoint_id == parent["checkpoint"]
    assert ckpt.metrics["stacked"]["on"] == parent["checkpoint"]
    assert json.loads((Path(ckpt.path) / "adapter_config.json").read_text())["r"] == 12
    reply = gym.inference.chat(model=ckpt.id, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=6,
                               temperature=0)
    assert reply.choices[0].message.content is not None
    with live.gym.gateway.store.transaction() as s:  # the new run's checkpoint is its own, not the earlier run's
        assert list(s.scalars(select(Checkpoint.id).where(Checkpoint.run_id == parent["key"]["id"],
                                                          Checkpoint.id == ckpt.id))) == []


# -- a stacked job resumed on another worker ----------------------------------------------------


class _Paid:
    performed, actual_nusd = False, 0


def test_a_stacked_job_resumed_after_its_worker_died_ends_with_the_same_weights(tmp_path: Path) -> None:
    """Two steps, a checkpoint with its state, a fresh trainer resuming: the same adapter as four steps in one go."""
    import torch
    from safetensors.torch import load_file

    from services.training.backends.local import LocalTrainer
    from services.training.schemas import JobRequest
    from services.training.trainer import Resume, TrainingInputs

    model_dir = resolve_model_dir_tiny()
    with torch_threads(1):
        torch.manual_seed(2)
        from peft import LoraConfig, get_peft_model

        alpha: Any = 16
        get_peft_model(load_model(str(model_dir)), LoraConfig(r=8, lora_alpha=alpha, init_lora_weights=False,
                                                               target_modules=["q_proj", "v_proj"])
                       ).save_pretrained(str(tmp_path / "parent"))
        rng = random.Random(4)
        pairs = [(render_prompt([user]), answer["content"] + IM_END)
                 for user, answer in (subtraction(rng) for _ in range(32))]
        request = JobRequest(datasets=["ds"], parent_checkpoint="ckpt_parent", lora=CHILD_LORA, **JOB)

        def run(trainer: LocalTrainer, steps: range, resume: Resume | None = None) -> None:
            trainer.prepare(TrainingInputs(model_dir=str(model_dir), parent_adapter=str(tmp_path / "parent"),
                                           pairs=pairs, request=request, steps=4, resume=resume))
            for step in steps:
                trainer.step(trainer.next_batch(), step, _Paid())

        whole = LocalTrainer()
        run(whole, range(1, 5))
        whole.save(4).save_pretrained(tmp_path / "whole")
        first = LocalTrainer()
        run(first, range(1, 3))
        first.save(2).save_pretrained(tmp_path / "at-2")
        first.save_state(tmp_path / "state-2")
        first.close()
        second = LocalTrainer()
        run(second, range(3, 5), Resume(2, str(tmp_path / "at-2"), str(tmp_path / "state-2")))
        second.save(4).save_pretrained(tmp_path / "resumed")

    a, b = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("whole", "resumed"))
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    assert json.loads((tmp_path / "resumed" / "adapter_config.json").read_text())["r"] == 12
