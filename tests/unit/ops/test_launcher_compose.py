"""Static check of the compose project the launcher writes for each run (ops/launcher_compose.py):
each run has a network of its own, internal, with only that run's agent, its relay to the gateway
and its egress proxy on it; no secret is in the file; its commands are real ``rsigym`` commands.
What Docker itself enforces for such a file (no route out of an internal network, DNS answering a
network's members only) cannot run here (no Docker engine): docs/security.md says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ops.launcher_compose import ComposeTarget, compose_plan, names
from tests.deploy.compose_local import COMPOSE_FILE, ROOT, networks_of, option
from tests.deploy.test_deploy_static import assert_real_rsigym_command

TARGET = ComposeTarget(file=COMPOSE_FILE, project_dir=ROOT)
GYM = yaml.safe_load(COMPOSE_FILE.read_text())


def _planned(tmp_path: Path, run: str, egress: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    run_dir = tmp_path / run
    run_dir.mkdir()
    (run_dir / "instruction.md").write_text("do it")
    plan = compose_plan(TARGET, run=run, track="joint", run_dir=run_dir, command=["python3", "-I", "/agent/x.py"],
                        egress=egress, key=f"rsk-secret-of-{run}")
    return plan, yaml.safe_load((run_dir / "compose.yml").read_text())


def _members(spec: dict[str, Any], network: str) -> set[str]:
    return {name for name, svc in spec["services"].items() if network in networks_of(svc)}


def test_each_run_has_its_own_internal_network_with_only_its_parts(tmp_path: Path) -> None:
    one_plan, one = _planned(tmp_path, "key_one", ["pypi.org"])
    two_plan, two = _planned(tmp_path, "key_two", ["pypi.org"])
    for run, plan, spec in (("key_one", one_plan, one), ("key_two", two_plan, two)):
        n = names(run)
        assert spec["name"] == f"rsigym-run-{run}"
        assert spec["networks"]["run"] == {"name": n["network"], "internal": True}
        assert spec["networks"]["core"] == {"name": "rsigym_agentnet", "external": True}
        assert spec["networks"]["outside"] == {"name": "rsigym_egress", "external": True}
        assert set(spec["networks"]) == {"run", "core", "outside"}
        # only this run's agent, its relay and its proxy are on the run's network
        assert _members(spec, "run") == {"agent", "gym", "egress"}
        assert networks_of(spec["services"]["agent"]) == {"run"}  # the agent: its own network, nothing else
        assert networks_of(spec["services"]["gym"]) == {"run", "core"}  # the relay: to the gateway
        assert networks_of(spec["services"]["egress"]) == {"run", "outside"}  # the proxy: the route out
        assert {s["container_name"] for s in spec["services"].values()} == {n["agent"], n["gym"], n["egress"]}
        assert plan["containers"] == [n["agent"], n["gym"], n["egress"]] and plan["network"] == n["network"]
        for name, svc in spec["services"].items():
            assert not svc.get("ports"), f"{name} publishes nothing"
            assert svc.get("cap_drop") == ["ALL"] and "no-new-privileges:true" in svc["security_opt"], name
            assert "privileged" not in svc and "network_mode" not in svc, name
        # the agent reaches the gateway through its run's relay, which relays to the gateway alone
        assert spec["services"]["agent"]["environment"]["RSIGYM_URL"] == f"http://{n['gym']}:8700"
        relay = spec["services"]["gym"]["command"]
        assert_real_rsigym_command("the run's relay", relay)
        assert option(relay, "--to") == [GYM["x-agent-env"]["RSIGYM_URL"]]
        assert_real_rsigym_command("the run's egress proxy", spec["services"]["egress"]["command"])
        # the agent's image is its track's, the relay's and the proxy's the gateway image of the gym's file
        assert spec["services"]["agent"]["image"] == GYM["services"]["agent-joint"]["image"]
        assert spec["services"]["egress"]["image"] == GYM["services"]["egress"]["image"]
    # Nothing of one run is in the other's file: no shared network, no name of the other's containers.
    text_one, text_two = yaml.safe_dump(one), yaml.safe_dump(two)
    assert not any(v in text_two for v in names("key_one").values())
    assert not any(v in text_one for v in names("key_two").values())
    # Secrets are in the docker CLI's environment only: not in the file, not on a command line.
    for plan, spec in ((one_plan, one), (two_plan, two)):
        text = yaml.safe_dump(spec)
        argv = [part for line in (*plan["detached"], plan["argv"]) for part in line]
        for secret in (plan["env"]["RSIGYM_API_KEY"], plan["env"]["RSIGYM_EGRESS_TOKEN"]):
            assert secret not in text and not [part for part in argv if secret in part]
    assert one_plan["env"]["RSIGYM_EGRESS_TOKEN"] != two_plan["env"]["RSIGYM_EGRESS_TOKEN"]


def test_a_run_without_an_allowlist_has_no_proxy_and_no_route_out(tmp_path: Path) -> None:
    plan, spec = _planned(tmp_path, "key_closed", [])
    assert set(spec["services"]) == {"agent", "gym"}
    assert set(spec["networks"]) == {"run", "core"}
    assert _members(spec, "run") == {"agent", "gym"}
    assert "RSIGYM_EGRESS_TOKEN" not in plan["env"] and not [p for p in plan["argv"] if "PROXY" in p]
