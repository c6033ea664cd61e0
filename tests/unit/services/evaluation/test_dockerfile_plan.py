"""Reading a task's Dockerfile happens in a trial's worker thread, next to everything else the
process does: it must not touch process-wide state. It used to redirect sys.stdout around the
converter (which print()s its warnings), so an operator CLI printing in the same process at the
same moment had its output stream swapped and closed under it (CI: ``ValueError: I/O operation on
closed file`` in a CliRunner polling ``rsigym run show`` while the gym evaluated)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from services.evaluation.harbor import image_plan


def test_the_converter_warnings_go_to_the_log_and_stdout_is_never_swapped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nSTOPSIGNAL SIGTERM\nCOPY a.txt /app/\n")
    real = image_plan.parse_dockerfile
    seen: list[Any] = []

    def parse(text: str, builder: Any) -> Any:
        seen.append(sys.stdout)  # what any other thread would be printing to right now
        return real(text, builder)

    monkeypatch.setattr(image_plan, "parse_dockerfile", parse)
    before = sys.stdout
    with caplog.at_level(logging.DEBUG, logger=image_plan.log.name):
        plan = image_plan.read_image_plan(tmp_path)
    assert seen == [before] and sys.stdout is before
    assert [c.sources for c in plan.copies] == [["a.txt"]]
    assert "Unsupported instruction: STOPSIGNAL" in caplog.text  # the converter's warning, logged
    assert "STOPSIGNAL" not in capsys.readouterr().out
