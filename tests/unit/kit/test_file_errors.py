"""A mistake in an operator's file (the gym config, a policy file) is one paragraph naming the
file, the key and what is allowed, with exit code 2 — never a traceback (issue 16, item 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from access.presets import policy_from_file
from kit.config import load_config
from kit.file_errors import FileError


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "RSIGYM_DATA_DIR": str(tmp_path)})


@pytest.mark.parametrize(("text", "expected"), [
    ("[rollout]\ndefault_max_tokenz = 5\n",
     "rollout.default_max_tokenz is not a setting here; allowed: backend, default_max_tokens, max_tokens_cap"),
    ("[rollout\n", "not valid TOML: Expected ']'"),
    ('[sandbox]\ndefault_timeout_s = "soon"\n', 'sandbox.default_timeout_s = "soon": Input should be a valid integer'),
    ('[[rollout.models]]\nname = "t"\nlitellm_modl = "openai/t"\n',
     "rollout.models.0.litellm_modl is not a setting here; allowed: api_base, api_key_env"),
])
def test_a_config_typo_is_one_paragraph_naming_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "gym.toml"
    config.write_text(text)
    with pytest.raises(FileError, match="gym config .*gym.toml: ") as caught:
        load_config(config)
    assert expected in " ".join(str(caught.value).split())
    done = _cli("up", "--config", str(config), "--port", "1", tmp_path=tmp_path)
    assert done.returncode == 2
    assert expected in " ".join(done.stderr.split()) and "Traceback" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) <= 6, done.stderr


def test_a_policy_file_typo_names_the_key_and_what_is_allowed_there(tmp_path: Path) -> None:
    toml = tmp_path / "policy.toml"
    toml.write_text("[services.rollout]\nmax_concurency = 3\n")
    with pytest.raises(FileError) as caught:
        policy_from_file(toml)
    text = " ".join(str(caught.value).split())
    assert "policy file" in text and "services.rollout.max_concurency is not a setting here" in text
    assert "allowed: build, cross_run, detail, door, fields, internet, max_concurrency" in text
    as_json = tmp_path / "policy.json"
    as_json.write_text('{"services": {"rollout": {"fields": {"temperature": {"rnge": [0, 1]}}}}}')
    with pytest.raises(FileError, match="unknown field rule 'rnge'"):
        policy_from_file(as_json)
    done = _cli("keys", "create", "--policy-file", str(toml), "--budget", "1", tmp_path=tmp_path)
    assert done.returncode == 2 and "max_concurency" in done.stderr and "Traceback" not in done.stderr
    missing = _cli("keys", "create", "--policy-file", str(tmp_path / "nope.toml"), "--budget", "1", tmp_path=tmp_path)
    assert missing.returncode == 2 and "cannot be read" in missing.stderr
