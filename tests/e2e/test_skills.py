"""Every example in the research agent's skills (agent_container/skills/*.md) runs.

One embedded gym on loopback with the offline stand-ins (the stand-in provider as rollout model
``teacher`` and as agent model ``agent-llm``, the tiny base model, a one-task-per-split copy of the
bundled ``arithmetic`` benchmark, validated for real), one fresh joint-track run key with an
agent-model budget; then each fenced block marked ``skill-example`` is executed as the agent would
run it: ``python`` blocks with the venv's interpreter, ``bash`` blocks with ``bash -euo pipefail``
and ``gym`` on PATH, both with only RSIGYM_URL and RSIGYM_API_KEY pointing at the gym."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.config import EvaluationConfig, GymConfig
from kit.settings import GymSettings, ProviderSecrets
from ops.builder import SERVICES, build_embedded
from services.rollout.standin import create_standin_app
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, gym_config
from tests.fakes.live_gym import LiveGym, mini_benchmark
from tests.fakes.servers import serve, serve_gym

ROOT = Path(__file__).resolve().parents[2]
SKILLS = ROOT / "agent_container" / "skills"
VENV_BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(python|bash) skill-example[^\n]*\n(.*?)^```\s*$", re.M | re.S)
# Every service the gateway routes, plus the two meters an agent spends on.
DOCS = (*SERVICES, "agent-model", "budget")
EXAMPLE_TIMEOUT_S = 240


def examples() -> list[tuple[str, int, str, str]]:
    out = []
    for doc in sorted(SKILLS.glob("*.md")):
        for index, match in enumerate(BLOCK.finditer(doc.read_text())):
            out.append((doc.name, index, match.group(1), match.group(2)))
    return out


EXAMPLES = examples()


def test_every_service_has_a_skills_doc_with_examples_in_three_forms() -> None:
    for name in DOCS:
        doc = SKILLS / f"{name}.md"
        assert doc.is_file(), f"no skills doc for {name}"
        blocks = [(lang, code) for d, _, lang, code in EXAMPLES if d == doc.name]
        langs = {lang for lang, _ in blocks}
        assert "python" in langs and "bash" in langs, f"{doc.name}: needs SDK (python) and bash examples"
        assert any("curl " in code for _, code in blocks), f"{doc.name}: no raw HTTP (curl) example"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveGym, dict[str, Any]]]:
    secret = "sk-teacher-" + secrets.token_hex(16)
    with serve(create_standin_app(secret)) as standin_url:
        api_base = standin_url + "/v1"
        config = gym_config(api_base).model_copy(update={
            "evaluation": EvaluationConfig(workers=2, trial_concurrency=4),
            "agent_models": GymConfig.model_validate({"agent_models": [
                {"name": "agent-llm", "litellm_model": "openai/teacher", "api_base": api_base,
                 "api_key_env": TEACHER_ENV, "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}]}).agent_models})
        data_dir = tmp_path_factory.mktemp("skills-gym")
        gym = build_embedded(GymSettings(data_dir=data_dir, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR),
                             config=config, provider_secrets=ProviderSecrets({TEACHER_ENV: secret}), run_reaper=False)
        try:
            with serve_gym(gym) as url:
                live = LiveGym(url, gym)
                try:
                    bench = mini_benchmark(tmp_path_factory.mktemp("bench"), name="arithmetic", per_split=1)
                    assert live.register(bench)["status"] == "ready"
                    r = live.http.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 20.0,
                                                               "agent_budget_usd": 2.0})
                    assert r.status_code == 201, r.text
                    yield live, r.json()
                finally:
                    live.http.close()
        finally:
            for name in ("evaluation", "training"):  # the server's lifespan closed the services; stop the workers
                getattr(gym.service_apps[name].state, name).runner.shutdown()


@pytest.mark.parametrize(("doc", "index", "lang", "code"), EXAMPLES,
                         ids=[f"{d.removesuffix('.md')}-{i}" for d, i, _, _ in EXAMPLES])
def test_example_runs(live: tuple[LiveGym, dict[str, Any]], tmp_path: Path, doc: str, index: int, lang: str,
                      code: str) -> None:
    gym, key = live
    env = {"PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "RSIGYM_URL": gym.url, "RSIGYM_API_KEY": key["key"]}
    argv = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, f"{doc} example {index} exited {done.returncode}\n{code}\n--- stdout\n" \
                                 f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
