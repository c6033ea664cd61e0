"""E2B parity where an agent notices, with the unmodified ``e2b`` SDK: configured by the environment
variables docs/agent-guide.md tells it to set, pause and resume refused as not supported (not "not
found", not "already paused"), and the templates listed — a built one too, and usable by its id."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b.api.client.api.templates import get_templates, get_v2_templates
from e2b.api.client.models import Template
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import SandboxException

from access.keys import KeyRegistry
from access.policy import Policy
from tests.conftest import create_key
from tests.fakes.servers import serve_gym

pytestmark = pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="needs bubblewrap")

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\nRUN echo built > /app/built.txt\n"


@pytest.fixture
def served(gym: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, Any]]]:
    """A gym, and the run key's agent configured as the agent guide says: by the environment alone
    (``E2B_DOMAIN`` left at something else: the two URLs win over it)."""
    with serve_gym(gym) as url:
        with httpx.Client(base_url=url) as c:
            run = create_key(c, budget_usd=2.0)
        monkeypatch.setenv("E2B_API_KEY", run["key"])
        monkeypatch.setenv("E2B_API_URL", f"{url}/sandbox")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/sandbox/envd")
        monkeypatch.setenv("E2B_DOMAIN", "e2b.invalid")
        yield url, run


def test_the_documented_variables_reach_the_gym(served: tuple[str, dict[str, Any]]) -> None:
    sbx = Sandbox.create(template="base", timeout=60)  # no api_key= / api_url= / sandbox_url=
    try:
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sbx.sandbox_id]
    finally:
        sbx.kill()


def test_pause_and_resume_are_refused_as_not_supported(served: tuple[str, dict[str, Any]]) -> None:
    url, run = served
    sbx = Sandbox.create(template="base", timeout=60)
    try:
        with pytest.raises(SandboxException) as paused:
            sbx.pause()  # a 409 would read as "already paused" and return False; a 404 as "not found"
        assert "400" in str(paused.value) and "pause is not supported by the gym's sandboxes" in str(paused.value)
        resumed = httpx.post(f"{url}/sandbox/sandboxes/{sbx.sandbox_id}/resume", json={},
                             headers={"X-API-Key": run["key"]})
        assert resumed.status_code == 400
        assert resumed.json()["error"]["type"] == "not_supported"
        assert "resume is not supported" in resumed.json()["error"]["message"]
        assert sbx.commands.run("echo still").stdout == "still\n"  # the refusal left it running
    finally:
        sbx.kill()
    # An unknown sandbox is still "not found", as on every route.
    gone = httpx.post(f"{url}/sandbox/sandboxes/nosuchsandbox/pause", json={}, headers={"X-API-Key": run["key"]})
    assert gone.status_code == 404


def test_templates_are_listed_and_a_built_one_is_usable_by_id(served: tuple[str, dict[str, Any]], gym: Any) -> None:
    url, run = served
    builder = KeyRegistry(gym.gateway.store).create(
        policy=Policy.model_validate({"services": {"sandbox": {"build": True, "internet": False}}}),
        budget_nusd=None, parent_id=run["id"], platform=True)[1]
    built = httpx.post(f"{url}/sandbox/v2/templates", headers={"X-API-Key": builder}, timeout=120,
                       json={"dockerfile": DOCKERFILE})
    assert built.status_code == 200, built.text
    tid = built.json()["templateID"]

    client = get_api_client(ConnectionConfig())  # the environment's, as the agent's SDK reads it
    for endpoint in (get_templates, get_v2_templates):
        listed = endpoint.sync(client=client)  # E2B's own model parses the gym's answer
        assert isinstance(listed, list) and all(isinstance(t, Template) for t in listed), listed
        by_id = {t.template_id: t for t in listed}
        assert "base" in by_id and tid in by_id
        assert by_id[tid].additional_properties["base"] == "base"
        assert by_id["base"].additional_properties["base"] is None

    sbx = Sandbox.create(template=tid, timeout=60)
    try:
        assert sbx.commands.run("cat /app/built.txt").stdout == "built\n"
    finally:
        sbx.kill()
