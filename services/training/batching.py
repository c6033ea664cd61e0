"""Turning (prompt, answer) text pairs into padded training batches with answer-only labels."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

IGNORE = -100


def encode_examples(tokenizer: Any, examples: list[tuple[str, str]], max_length: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example; the loss sees only the answer's tokens."""
    out = []
    for prompt, answer in examples:
        p = tokenizer.encode(prompt, add_special_tokens=False)
        a = tokenizer.encode(answer, add_special_tokens=False)
        ids = (p + a)[:max_length]
        labels = ([IGNORE] * len(p) + a)[:max_length]
        if any(label != IGNORE for label in labels):
            out.append((ids, labels))
    return out


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def shuffled_chunks(rows: list[tuple[list[int], list[int]]], batch_size: int, *, seed: int,
                    epochs: int | None = None) -> Iterator[list[tuple[list[int], list[int]]]]:
    """Shuffled batches of rows, epoch after epoch (forever when ``epochs`` is None): the one
    batch order every trainer uses, so local and remote runs of one job see the same data."""
    rng = random.Random(seed)
    order = list(range(len(rows)))
    epoch = 0
    while epochs is None or epoch < epochs:
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [rows[i] for i in order[start : start + batch_size]]
            if chunk:
                yield chunk
        epoch += 1


def iterate_batches(rows: list[tuple[list[int], list[int]]], batch_size: int, *, seed: int, pad_id: int,
                    epochs: int | None = None, skip: int = 0) -> Iterator[dict[str, Any]]:
    """Shuffled, padded tensor batches (see :func:`shuffled_chunks`), the first ``skip`` left out
    (a resumed job continues the same order after the batches it had taken)."""
    for chunk in itertools.islice(shuffled_chunks(rows, batch_size, seed=seed, epochs=epochs), skip, None):
        yield collate(chunk, pad_id)
