"""The project-built tiny base model: deterministic, offline, small enough to train on 2 cores.

A byte-level BPE tokenizer (vocab ≤ 512, one token per digit) is trained with ``tokenizers`` on
the synthetic corpus (plus subtraction and tool-call text, for the tokenizer only); a
Qwen3-architecture causal LM (hidden 192, 2 layers, ~0.9 M parameters) is initialised from a seed
and pre-trained (~1-1.5 min on 2 cores) on chat-formatted addition, comparing and counting
numbers, and copying words and JSON. The result knows the chat format and addition (~99% on
two-digit sums) but not subtraction or tool calls (0-3%, none) — what an agent is meant to add by
training: a rank-16 LoRA learns two-digit subtraction (lr 6e-3, linear decay, batch 16). When it
starts to generalise to held-out questions depends sharply on lr, data order and the base weights,
and those weights move with the CPU's float arithmetic: on one machine's build 400 steps reach 0.9
on the arithmetic dev split, on another's the loss sits at 1.39 through step 400 (dev ~0.1); 800
steps reach 0.95-1.0 on both kinds of base. Tests that need a trained skill use 800 steps.

``rsigym models build-tiny`` builds it into ``<models dir>/tiny`` (``~/.cache/rsigym/models``); the build is keyed by a
hash of its recipe, so a second call reuses the cached model.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.models.chat_format import EOT, SPECIAL_TOKENS, split_example
from services.models.synthetic import DEFAULT_MIX, pretraining_corpus, tokenizer_texts


@dataclass(frozen=True)
class TinyRecipe:
    seed: int = 1234
    vocab_size: int = 512
    hidden_size: int = 192
    intermediate_size: int = 512
    layers: int = 2
    heads: int = 6
    kv_heads: int = 2
    max_positions: int = 256
    corpus_rows: int = 40_000
    tokenizer_rows: int = 500
    mix: tuple[tuple[str, int], ...] = DEFAULT_MIX
    steps: int = 1000
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup: float = 0.05
    weight_decay: float = 0.01
    version: int = 4

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _train_tokenizer(texts: list[str], recipe: TinyRecipe, out: Path) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # One token per digit (arithmetic is learnable only if numbers are not merged into arbitrary chunks);
    # a word keeps its trailing space or newline and an operator its surrounding spaces, so prompts are
    # short, "What is 1 + 2?" and "What is 1 - 2?" have the same layout, and a word inside a sentence is
    # the same token as the word quoted in JSON (a tool call copies it).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{L}+[ \n]?|\p{N}| ?[^\s\p{L}\p{N}]+ ?|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, pad_token=EOT,
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.save_pretrained(out)
    return fast


def _examples(recipe: TinyRecipe) -> list[tuple[str, str]]:
    return [split_example(messages) for messages in pretraining_corpus(recipe.corpus_rows, recipe.seed, recipe.mix)]


def _tokenizer_texts(recipe: TinyRecipe) -> list[str]:
    texts = []
    for row in tokenizer_texts(recipe.tokenizer_rows, recipe.seed + 1):
        messages, tools = (row["messages"], row.get("tools")) if isinstance(row, dict) else (row, None)
        texts.append("".join(split_example(messages, tools)))
    return texts


def _batches(rows: list[tuple[list[int], list[int]]], batch_size: int, seed: int, pad_id: int) -> Any:
    """Shuffled batches, epoch after epoch; short and long rows are batched apart (little padding)."""
    from services.training.batching import collate

    rng = random.Random(seed)
    buckets: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(rows):
        buckets.setdefault(len(ids) // 24, []).append(i)
    while True:
        batches = []
        for key in sorted(buckets):
            order = buckets[key]
            rng.shuffle(order)
            batches += [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        rng.shuffle(batches)
        for batch in batches:
            yield collate([rows[i] for i in batch], pad_id)


def _is_built(target: Path, recipe: TinyRecipe) -> bool:
    stamp = target / "recipe.json"
    return stamp.exists() and json.loads(stamp.read_text()).get("digest") == recipe.digest()


def build_tiny(models_dir: Path, recipe: TinyRecipe | None = None, *, log: Any = print,
               on_step: Callable[[int, int], None] | None = None) -> Path:
    """Build (or reuse) the tiny base model; returns its directory.

    Processes sharing a models dir (test runs, a gym and a benchmark) take a file lock, so one
    builds and the others wait for it and reuse the result. ``on_step(step, total)`` follows the
    pre-training (a progress bar)."""
    import fcntl

    recipe = recipe or TinyRecipe()
    target = Path(models_dir) / "tiny"
    if _is_built(target, recipe):
        return target
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(models_dir) / ".tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_built(target, recipe):
            return target
        return _build_in_child(target, recipe, log, on_step)


_PROGRESS = re.compile(r"tiny progress (\d+)/(\d+)")


def _build_in_child(target: Path, recipe: TinyRecipe, log: Any,
                    on_step: Callable[[int, int], None] | None = None) -> Path:
    """Run :func:`_build` in a fresh interpreter, so the same recipe always gives the same weights.

    The weights are initialised from torch's process-wide generator: in a serving or test process,
    any other thread drawing on it between the seed and the initialisation (a LoRA job starting, a
    sampler) changes the model — and a LoRA's ability to learn a held-out skill in a few hundred
    steps differs sharply between such models. A child process has no other thread."""
    cmd = [sys.executable, "-m", "services.models.tiny", str(target), json.dumps(asdict(recipe))]
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if (progress := _PROGRESS.fullmatch(line)) is not None:
                if on_step is not None:
                    on_step(int(progress[1]), int(progress[2]))
            elif line.startswith("tiny "):
                log(line)
            tail = (tail + [line])[-20:]
    if proc.returncode != 0 or not _is_built(target, recipe):
        raise RuntimeError(f"building the tiny model failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return target


def _build(target: Path, recipe: TinyRecipe, log: Any) -> Path:
    models_dir = target.parent

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from services.training.batching import encode_examples

    started = time.monotonic()
    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tiny-", dir=Path(models_dir)))
    try:
        examples = _examples(recipe)
        tokenizer = _train_tokenizer([p + a for p, a in examples] + _tokenizer_texts(recipe), recipe, work)
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=recipe.hidden_size,
            intermediate_size=recipe.intermediate_size,
            num_hidden_layers=recipe.layers,
            num_attention_heads=recipe.heads,
            num_key_value_heads=recipe.kv_heads,
            head_dim=recipe.hidden_size // recipe.heads,
            max_position_embeddings=recipe.max_positions,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
            pad_token_id=tokenizer.pad_token_id,
        )
        model = Qwen3ForCausalLM(config)
        encoded = encode_examples(tokenizer, examples, max_length=64)
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=recipe.learning_rate, total_steps=recipe.steps,
                                                       pct_start=recipe.warmup)
        model.train()
        batches = _batches(encoded, recipe.batch_size, recipe.seed, tokenizer.pad_token_id)
        for step in range(1, recipe.steps + 1):
            batch = next(batches)
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 200 == 0 or step == 1:
                log(f"tiny pre-training step {step}/{recipe.steps} loss {loss.item():.4f}")
            if step % 10 == 0:
                log(f"tiny progress {step}/{recipe.steps}")
        model.eval()
        model.save_pretrained(work, safe_serialization=True)
        (work / "recipe.json").write_text(json.dumps({"digest": recipe.digest(), "recipe": asdict(recipe),
                                                      "seconds": round(time.monotonic() - started, 1)}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        work.rename(target)  # atomic: a half-built model is never visible under models/tiny
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return target


def _main(argv: list[str]) -> None:
    """``python -m services.models.tiny TARGET RECIPE_JSON``: the child of :func:`_build_in_child`."""
    fields = json.loads(argv[1])
    fields["mix"] = tuple(tuple(pair) for pair in fields["mix"])
    _build(Path(argv[0]), TinyRecipe(**fields), lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    _main(sys.argv[1:])
