"""Building a base model shows its progress (issue 16, item 2): a bar with an ETA on a terminal,
plain lines with an ETA otherwise — fed by the real build's child process."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from ops.cli.progress import build_progress
from services.models.tiny import TinyRecipe, build_tiny


def test_a_real_build_reports_every_step_and_plain_lines_carry_an_eta(tmp_path: Path) -> None:
    steps: list[tuple[int, int]] = []
    recipe = TinyRecipe(corpus_rows=400, tokenizer_rows=50, steps=40, batch_size=4, hidden_size=48,
                        intermediate_size=64, heads=2, kv_heads=1, layers=1)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with build_progress(console, "building tiny") as on_step:
        def both(step: int, total: int) -> None:
            steps.append((step, total))
            on_step(step, total)

        build_tiny(tmp_path, recipe, log=lambda _line: None, on_step=both)
    assert steps == [(s, 40) for s in range(10, 41, 10)]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("building tiny: step 10/40 (25%), about ") and lines[0].endswith(" s left")
    assert lines[-1].startswith("building tiny: step 40/40 (100%)")
    # built: a second call reports nothing (the cache is reused)
    again: list[tuple[int, int]] = []
    build_tiny(tmp_path, recipe, log=lambda _line: None, on_step=lambda s, t: again.append((s, t)))
    assert again == []


def test_on_a_terminal_the_bar_shows_the_count_and_leaves_no_residue() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with build_progress(console, "building tiny") as on_step:
        for step in range(10, 101, 10):
            on_step(step, 100)
    assert "building tiny" in out.getvalue() and "/100" in out.getvalue()
