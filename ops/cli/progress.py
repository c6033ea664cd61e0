"""Progress of a long local build (pre-training the tiny base model) on the operator's console:
a bar with an ETA on a terminal, a plain line every tenth of the way (with its ETA) otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


@contextmanager
def build_progress(console: Console, label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``on_step(step, total)`` callback that shows the build's progress; nothing is shown
    when no step is reported (the model was already built)."""
    if console.is_terminal:
        with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                      TimeRemainingColumn(), console=console, transient=True) as bar:
            task: list[TaskID] = []

            def on_bar(step: int, total: int) -> None:
                if not task:
                    task.append(bar.add_task(label, total=total))
                bar.update(task[0], completed=step)

            yield on_bar
        return
    started, shown = time.monotonic(), [0]

    def on_line(step: int, total: int) -> None:
        tenth = step * 10 // max(total, 1)
        if tenth > shown[0]:
            shown[0] = tenth
            elapsed = time.monotonic() - started
            eta = elapsed / step * (total - step)
            console.print(f"{label}: step {step}/{total} ({step * 100 // max(total, 1)}%), about {eta:.0f} s left")

    yield on_line
