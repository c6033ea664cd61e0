"""``rsigym run start --repeat N --seed S`` on a live embedded gym: N runs, each its own key and
run, in one repeat group (on the key's name, which the admin API lists; index and seed in
run.json), the seed passed to the agent through its template's ``seed_flag``; ``rsigym analyses``
then covers those runs from their records and ledgers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from access import repeats
from ops.cli.main import app as operator_cli
from tests.conftest import ADMIN_TOKEN, require_bwrap
from tests.fakes.servers import serve_gym

# The scripted agent takes no seed; this registry's copy passes the seed as its --sleep (seconds),
# an option it has: what reaches the agent's argv is what the run records.
SEEDED_AGENTS = """
[agents.seeded]
command = ["/usr/bin/python3", "-I", "/agent/scripted.py"]
seed_flag = "--sleep"

[agents.unseeded]
command = ["/usr/bin/python3", "-I", "/agent/scripted.py"]
"""


@pytest.fixture
def live(make_gym: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    require_bwrap()
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with serve_gym(make_gym()) as url:
        monkeypatch.setenv("RSIGYM_URL", url)
        monkeypatch.setenv("RSIGYM_ADMIN_TOKEN", ADMIN_TOKEN)
        monkeypatch.setenv("RSIGYM_DATA_DIR", str(data_dir))
        yield url, data_dir


def rsigym(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(operator_cli, list(args))
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args and code == 0 else result.output


def test_repeat_starts_a_group_of_seeded_runs_and_analyses_cover_them(live: tuple[str, Path], tmp_path: Path) -> None:
    _, data_dir = live
    agents = tmp_path / "agents.toml"
    agents.write_text(SEEDED_AGENTS)
    started = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "seeded", "--agents", str(agents),
                     "--repeat", "2", "--seed", "0", "--json")
    group, runs = started["repeat_group"], started["data"]
    assert repeats.group_of(f"x {group}") == group
    assert [(r["repeat_group"], r["repeat_index"], r["repeat_count"], r["seed"]) for r in runs] == [
        (group, 0, 2, 0), (group, 1, 2, 1)]
    assert len({r["run"] for r in runs}) == 2 and len({r["key_id"] for r in runs}) == 2
    for r in runs:  # the seed reached the agent's command line
        plan = json.loads((data_dir / "runs" / r["run"] / "supervise.json").read_text())
        assert plan["command"][-2:] == ["--sleep", str(r["seed"])]
    # The group is a fact of each run key: the admin API lists it (and nothing of index or seed).
    keys = {k["id"]: k for k in rsigym("keys", "list", "--json")["data"]}
    for r in runs:
        assert keys[r["key_id"]]["name"] == f"joint-arithmetic {group}"
        assert repeats.group_of(keys[r["key_id"]]["name"]) == group
    # run list shows the group too (run.json).
    listed = {r["run"]: r for r in rsigym("run", "list", "--json")["data"]}
    assert {listed[r["run"]]["repeat_group"] for r in runs} == {group}

    # An LLM-like agent (no seed_flag) is repeated, not seeded: --seed is refused before any key is minted.
    out = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "unseeded", "--agents", str(agents),
                 "--repeat", "2", "--seed", "0", code=1)
    assert "repeated, not seeded" in out
    assert len(rsigym("keys", "list", "--json")["data"]) == len(keys)
    alone = rsigym("run", "start", "--task", "joint-arithmetic", "--agent", "unseeded", "--agents", str(agents),
                   "--repeat", "2", "--json")
    assert [(r["repeat_index"], r["seed"]) for r in alone["data"]] == [(0, None), (1, None)]

    # The analyses read the runs' records and ledgers from the gym.
    out_dir = tmp_path / "analyses"
    data = rsigym("analyses", "--out", str(out_dir), *(a for r in runs for a in ("--run", r["run"])), "--json")
    assert set(data["runs"]) == {r["run"] for r in runs}
    for r in runs:
        assert (out_dir / f"best-so-far-{r['run']}.png").is_file() and (out_dir / f"tool-use-{r['run']}.png").is_file()
    assert data["hacking_incidence"]["runs"] == 0 and (out_dir / "hacking-incidence.png").is_file()
    for r in [*runs, *alone["data"]]:
        rsigym("run", "stop", r["run"])
