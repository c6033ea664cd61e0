"""One models cache (issue 16, item 2): ``rsigym up``, ``rsigym demo`` and the tests find built base
models in the same directory unless ``RSIGYM_MODELS_DIR`` names another, so a fresh data dir never
pre-trains the tiny model again."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.settings import GymSettings, default_models_dir
from tests import conftest


def test_every_gym_shares_one_models_dir_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RSIGYM_MODELS_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    shared = Path.home() / ".cache" / "rsigym" / "models"
    assert default_models_dir() == shared
    # two gyms with fresh data dirs: one models dir (the data dir no longer decides)
    assert GymSettings(data_dir=tmp_path / "a").resolved_models_dir() == shared
    assert GymSettings(data_dir=tmp_path / "b").resolved_models_dir() == shared
    monkeypatch.setenv("RSIGYM_MODELS_DIR", str(tmp_path / "elsewhere"))
    assert GymSettings(data_dir=tmp_path / "a").resolved_models_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("RSIGYM_MODELS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert GymSettings().resolved_models_dir() == tmp_path / "xdg" / "rsigym" / "models"


def test_the_suite_uses_the_same_models_dir() -> None:
    import os

    assert conftest.MODELS_DIR == Path(os.environ.get("RSIGYM_MODELS_DIR") or default_models_dir())
