"""Fuzzing the gateway from its OpenAPI documents (schemathesis): no input an agent or an admin
can send makes the gym fail (no 5xx), and every refusal is the one standard error shape, with
the response's ``X-Request-Id`` as its ``request_id``.

The documents: the gateway's own (admin and ``/v1`` routes) and every service's, with its paths
under ``/<service>`` as an agent reaches them through the gateway, plus the request models of
the routes that read their JSON body themselves (so the fuzzer sends their real fields). Each
operation gets ``EXAMPLES`` derandomized examples that follow its schema and as many that break
it, sent to an embedded gym on loopback with a valid run key (agent routes) or the admin token
(``/admin``); no shrinking, so the file runs in about a minute.

Nothing is left out, but two routes get a spare key as their path parameter so that the key
under test stays usable: ``/admin/v1/keys/{key_id}/{action}`` (revoke, pause) and
``/v1/keys/{key_id}/revoke``. The research agent's model route (``/agent/v1``, on the run's
agent-model meter) is fuzzed from the rollout service's document. Not described by any document,
so not fuzzed here: the E2B daemon's Connect RPCs (``/sandbox/envd/...``;
tests/security/test_stream_bounds.py and bench/load.py reach them).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from pydantic import BaseModel
from schemathesis import GenerationMode

from gateway.builder import Gym, build_embedded
from services.core.settings import GymSettings, ProviderSecrets, StoreSettings
from services.core.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, admin_headers, gym_config
from tests.fakes.servers import serve_gym

EXAMPLES = 10
"""Examples per operation and generation mode (positive, negative): bounded for ``make test``."""
SERVICES = ("rollout", "training", "inference", "sandbox", "evaluation", "records")
ERROR_KEYS = {"type", "error", "request_id", "code", "message"}


@dataclass
class Target:
    url: str
    gym: Gym
    run_key: str
    key_id: str
    spare_key_id: str
    spec: dict[str, Any] = field(default_factory=dict)


def _prefixed(service: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A service's paths as the gateway serves them (under ``/<service>``), its schemas renamed
    so that two services' models with one name do not collide."""
    text = json.dumps(spec).replace("#/components/schemas/", f"#/components/schemas/{service}__")
    renamed = json.loads(text)
    paths = {f"/{service}{path}": ops for path, ops in renamed.get("paths", {}).items()}
    schemas = {f"{service}__{name}": body for name, body in renamed.get("components", {}).get("schemas", {}).items()}
    return {"paths": paths, "schemas": schemas}


def _bodies() -> dict[tuple[str, str], type[BaseModel]]:
    """The request models of the routes that read their JSON body themselves (so their OpenAPI
    operation declares none): put into the document so that the fuzzer sends their real fields."""
    from services.evaluation import schemas as evaluation
    from services.records import schemas as records
    from services.rollout import schemas as rollout
    from services.sandbox import schemas as sandbox
    from services.training import schemas as training

    return {
        ("post", "/rollout/v1/chat/completions"): rollout.ChatRequest,
        ("post", "/rollout/agent/v1/chat/completions"): rollout.ChatRequest,
        ("post", "/agent/v1/chat/completions"): rollout.ChatRequest,
        ("post", "/inference/v1/chat/completions"): rollout.ChatRequest,
        ("post", "/training/v1/jobs"): training.JobRequest,
        ("post", "/evaluation/v1/jobs"): evaluation.JobRequest,
        ("post", "/evaluation/v1/submissions"): evaluation.SubmissionRequest,
        ("post", "/records/v1/experiments"): records.ExperimentRequest,
        ("post", "/records/v1/annotations"): records.AnnotationEnvelope,
        ("post", "/sandbox/sandboxes"): sandbox.CreateSandbox,
        ("post", "/sandbox/v2/sandboxes"): sandbox.CreateSandbox,
    }


def _declare_bodies(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    for (method, path), model in _bodies().items():
        operation = spec["paths"][path][method]
        schema = model.model_json_schema(ref_template="#/components/schemas/body__{model}")
        for name, part in schema.pop("$defs", {}).items():
            schemas[f"body__{name}"] = part
        schemas[f"body__{model.__name__}"] = schema
        operation.setdefault("requestBody", {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/body__{model.__name__}"}}}})


def combined_spec(gym: Gym) -> dict[str, Any]:
    spec: dict[str, Any] = gym.app.openapi()
    spec = json.loads(json.dumps(spec))
    spec.setdefault("components", {}).setdefault("schemas", {})
    for service in SERVICES:
        app = gym.service_apps[service]
        app = getattr(app, "app", app)  # the sandbox's daemon dispatcher wraps its FastAPI app
        part = _prefixed(service, app.openapi())
        spec["paths"].update(part["paths"])
        if service == "rollout":  # the research agent's own model: the gateway's /agent/v1 route
            spec["paths"].update({path.removeprefix("/rollout"): ops for path, ops in part["paths"].items()
                                  if path.startswith("/rollout/agent/")})
        spec["components"]["schemas"].update(part["schemas"])
    _declare_bodies(spec)
    return spec


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, standin: tuple[str, Any], teacher_secret: str) -> Iterator[Target]:
    data = tmp_path_factory.mktemp("fuzz")
    gym_settings = GymSettings(data_dir=data, admin_token=ADMIN_TOKEN, models_dir=MODELS_DIR)
    store = Store(sqlite_url(gym_settings.data_dir), StoreSettings())
    store.migrate()
    gym = build_embedded(gym_settings, config=gym_config(standin[0]), store=store,
                         provider_secrets=ProviderSecrets({TEACHER_ENV: teacher_secret}), run_reaper=False)
    try:
        with serve_gym(gym) as url, httpx.Client(base_url=url, timeout=60) as client:
            made = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 5.0, "agent_budget_usd": 1.0},
                               headers=admin_headers())
            assert made.status_code == 201, made.text
            spare = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0}, headers=admin_headers())
            assert spare.status_code == 201, spare.text
            row = made.json()
            yield Target(url, gym, row["key"], row["id"], spare.json()["id"], combined_spec(gym))
    finally:
        for service_app in gym.service_apps.values():
            runner = getattr(getattr(service_app.state, "training", None), "runner", None)
            if runner is not None:
                runner.wait_idle(timeout=60)
                runner.shutdown()
            close = getattr(service_app.state, "close", None)
            if close is not None:
                close()
        store.dispose()


def standard_error_problem(response: Any) -> str | None:
    """What is wrong with an error response's body, or None when it is the standard shape."""
    try:
        body = response.json()
    except ValueError:
        return f"not JSON: {response.text[:120]!r}"
    if not isinstance(body, dict) or not ERROR_KEYS <= set(body) or body.get("type") != "error":
        return f"not the standard shape: {str(body)[:200]}"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"type", "message", "param"}:
        return f"error object is not {{type, message, param}}: {error!r}"
    if not isinstance(error["type"], str) or not isinstance(error["message"], str) or not error["message"]:
        return f"error type/message missing: {error!r}"
    if body["code"] != response.status_code or body["message"] != error["message"]:
        return f"code/message do not repeat the status and message: {body!r}"
    header = response.headers.get("x-request-id")
    header = header[0] if isinstance(header, list) and len(header) == 1 else header  # schemathesis: lists
    if not isinstance(body["request_id"], str) or header != body["request_id"]:
        return f"request_id {body['request_id']!r} is not the X-Request-Id header {header!r}"
    return None


def _headers(path: str, target: Target) -> dict[str, str]:
    if path.startswith("/admin/"):
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return {"Authorization": f"Bearer {target.run_key}"}


def _overrides(path: str, target: Target) -> dict[str, Any]:
    """Destructive key actions run on the spare key; every other route gets generated ids."""
    if path in ("/admin/v1/keys/{key_id}/{action}", "/v1/keys/{key_id}/revoke"):
        return {"key_id": target.spare_key_id}
    return {}


def _probe(target: Target, case: Any, mode: GenerationMode, problems: list[str], statuses: Counter[int]) -> None:
    """Send one generated case; note a 5xx, a failed connection or an error not in the standard shape."""
    label = f"{case.method} {case.formatted_path}"
    try:
        response = case.call(base_url=target.url, headers=_headers(case.path, target), timeout=60)
    except Exception as err:  # the connection itself failed: the server gave up on us
        problems.append(f"{label} [{mode.value}]: {type(err).__name__}: {err}")
        return
    statuses[response.status_code] += 1
    sent = "" if case.body is None or type(case.body).__name__ == "NotSet" else f" body {str(case.body)[:160]}"
    where = f"{label}{sent} -> {response.status_code} [{mode.value}]"
    if response.status_code >= 500:
        problems.append(f"{where}: server error {response.text[:200]}")
    elif response.status_code >= 400 and (problem := standard_error_problem(response)):
        problems.append(f"{where}: {problem}")


def _checker(target: Target, mode: GenerationMode, problems: list[str], statuses: Counter[int]) -> Any:
    def check(case: Any) -> None:
        _probe(target, case, mode, problems, statuses)

    return check


def fuzz(target: Target, prefix: str) -> tuple[list[str], Counter[int]]:
    """Fuzz every operation whose path starts with ``prefix``: the problems found, one a line,
    and how many responses had each status."""
    schema = schemathesis.openapi.from_dict(target.spec)
    problems: list[str] = []
    statuses: Counter[int] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    chosen = [op for op in operations if op.path.startswith(prefix)]
    assert chosen, f"no operation under {prefix}"
    bounded = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                       phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    for op in chosen:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = op.as_strategy(generation_mode=mode, path_parameters=_overrides(op.path, target) or None)
            check = bounded(given(case=strategy)(_checker(target, mode, problems, statuses)))
            try:
                check()
            except Unsatisfiable:  # nothing to break: an operation without parameters or body
                assert mode is GenerationMode.NEGATIVE, f"no valid input for {op.method} {op.path}"
    return problems, statuses


@pytest.mark.parametrize("prefix", ["/admin/", "/v1/", "/agent/", *(f"/{s}/" for s in SERVICES)])
def test_no_input_breaks_the_gateway(target: Target, prefix: str) -> None:
    problems, statuses = fuzz(target, prefix)
    print(prefix, dict(sorted(statuses.items())))
    assert not problems, "\n".join(dict.fromkeys(problems))


@pytest.mark.parametrize("path", [
    "/admin/v1/evaluation/jobs/%1F%C3%96",  # a control character: httpx refused to build the URL (500)
    "/admin/v1/evaluation/jobs/job%23x/results",  # '#': the service got a truncated path
    "/admin/v1/datasets/%3Fq/content",  # '?': the rest of the id became a query
    "/admin/v1/runs/..%5C/events",
])
def test_operator_ids_no_url_can_carry_are_not_found(target: Target, path: str) -> None:
    """Found by the fuzzer: ids that a URL cannot carry as they are broke the operator routes."""
    response = httpx.get(target.url + path, headers=admin_headers(), timeout=30)
    assert response.status_code == 404, response.text
    assert standard_error_problem(response) is None, standard_error_problem(response)


@pytest.mark.parametrize(("path", "body"), [
    ("/admin/v1/keys/{key}/topup", {"amount_usd": 1.3e308}),  # overflowed the ledger's integers (500)
    ("/admin/v1/keys/{key}/deadline", {"deadline_s": 6.7e16}),  # overflowed the datetime (500)
])
def test_amounts_beyond_the_ledger_are_refused(target: Target, path: str, body: dict[str, Any]) -> None:
    with httpx.Client(base_url=target.url, timeout=30) as client:
        before = client.get("/v1/balance", headers={"Authorization": f"Bearer {target.run_key}"}).json()
        response = client.post(path.format(key=target.key_id), json=body, headers=admin_headers())
        after = client.get("/v1/balance", headers={"Authorization": f"Bearer {target.run_key}"}).json()
    assert response.status_code == 422, response.text
    assert standard_error_problem(response) is None
    assert after == before  # nothing was added, the key still answers
