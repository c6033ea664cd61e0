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

Hypothesis writes Unicode text only, so the text no parser should take is sent by hand: a lone
surrogate (escaped, or encoded as UTF-8 bytes), overlong UTF-8, a stray byte and NUL, in a body
to every route with a body in every document (never a 5xx; refused where the body is parsed,
kit/request_json.py), in a chat to each model route (refused before anything is billed)
and in the daemon's RPC messages.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies
from hypothesis.errors import Unsatisfiable
from pydantic import BaseModel
from schemathesis import GenerationMode

from kit import request_json
from kit.config import GymConfig
from kit.request_json import unholdable
from kit.settings import GymSettings, ProviderSecrets, StoreSettings
from ops.builder import Gym, build_embedded
from storage.store import Store, sqlite_url
from tests.conftest import ADMIN_TOKEN, MODELS_DIR, TEACHER_ENV, admin_headers, gym_config, require_bwrap
from tests.fakes.servers import serve_gym

EXAMPLES = 10
"""Examples per operation and generation mode (positive, negative): bounded for ``make test``."""
SERVICES = ("rollout", "training", "inference", "sandbox", "evaluation", "records")
ERROR_KEYS = {"type", "error", "request_id", "code", "message"}
AGENT_MODEL = "agent-llm"


def fuzz_config(api_base: str) -> GymConfig:
    """The test gym's config with one agent model, so the agent routes (``/agent/v1``) are
    reached past their model check."""
    agent = {"name": AGENT_MODEL, "litellm_model": "openai/teacher", "api_base": api_base, "api_key_env": TEACHER_ENV,
             "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    return gym_config(api_base).model_copy(update={"agent_models": GymConfig.model_validate(
        {"agent_models": [agent]}).agent_models})


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
    gym = build_embedded(gym_settings, config=fuzz_config(standin[0]), store=store,
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


# -- text no JSON parser should take: every body gets a 4xx, never a 5xx (kit/request_json.py) --

BAD_TEXT: dict[str, tuple[bytes, int]] = {
    # name: (a JSON string literal as the attacker writes it into the body, the refusal's status)
    "lone surrogate escape": (rb'"\ud800"', 422),
    "lone low surrogate escape": (rb'"x\udfff"', 422),
    "UTF-8 encoded surrogate": (b'"\xed\xa0\x80"', 400),
    "overlong UTF-8": (b'"\xc0\xaf"', 400),
    "stray byte": (b'"\xff"', 400),
}
"""Strings no store or provider can take: refused where the body is parsed, on every route."""
NUL = rb'"a\u0000b"'
CHAT_ROUTES = {
    "/rollout/v1/chat/completions": "teacher",
    "/openai/v1/chat/completions": "teacher",
    "/inference/v1/chat/completions": "tiny",
    "/agent/v1/chat/completions": AGENT_MODEL,
    "/agent/v1/messages": AGENT_MODEL,
}
"""The model routes (each gave a 500 for a lone surrogate before it was refused at parse) and a
model each one serves, so the body gets as far as the cost estimate."""


def _chat(model: str, content: bytes) -> bytes:
    return b'{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":%s}]}' % (model.encode(), content)


def _post(target: Target, path: str, body: bytes, method: str = "POST", key: str | None = None) -> httpx.Response:
    headers = {**_headers(path, target), "Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(method, target.url + path, content=body, headers=headers, timeout=60)


def _own_key(target: Target) -> tuple[str, str]:
    """A key of the test's own (its secret and id): the fuzzer's sandboxes, still alive on the run
    key, settle their seconds on it while a test runs."""
    made = httpx.post(f"{target.url}/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0, "agent_budget_usd": 1.0},
                      headers=admin_headers(), timeout=30)
    assert made.status_code == 201, made.text
    return made.json()["key"], made.json()["id"]


def _books(target: Target, key: str, key_id: str) -> tuple[Any, Any]:
    """What an attacker's refused call could have left on the key: its balance (spent and
    reserved) and its ledger rows."""
    with httpx.Client(base_url=target.url, timeout=30) as client:
        balance = client.get("/v1/balance", headers={"Authorization": f"Bearer {key}"}).json()
        rows = client.get(f"/admin/v1/keys/{key_id}/ledger", headers=admin_headers()).json()
    return balance, rows


@pytest.mark.parametrize("kind", list(BAD_TEXT))
@pytest.mark.parametrize("path", list(CHAT_ROUTES))
def test_a_chat_with_text_no_model_can_read_is_refused_unbilled(target: Target, path: str, kind: str) -> None:
    literal, status = BAD_TEXT[kind]
    key, key_id = _own_key(target)
    before = _books(target, key, key_id)
    response = _post(target, path, _chat(CHAT_ROUTES[path], literal), key=key)
    assert response.status_code == status, response.text
    assert standard_error_problem(response) is None, standard_error_problem(response)
    error = response.json()["error"]
    if status == 422:  # a well-formed body whose string is not text: the field is named
        assert error["param"] == "messages.0.content" and "surrogate" in error["message"], error
    else:
        assert error["type"] == "invalid_request_error" and "not UTF-8" in error["message"], error
    assert _books(target, key, key_id) == before  # nothing billed, nothing reserved, no ledger row


def test_nul_is_taken_in_a_prompt_and_refused_where_it_would_be_stored(target: Target) -> None:
    """A model's prompt may hold NUL (relayed, kept as escaped JSON); a name the store keeps may
    not (PostgreSQL's text cannot hold it: a 500 there before)."""
    chat = _post(target, "/rollout/v1/chat/completions", _chat("teacher", NUL))
    assert chat.status_code == 200, chat.text
    for path, body, param in [
        ("/records/v1/experiments", b'{"name":%s}' % NUL, "name"),
        ("/records/v1/annotations", b'{"kind":"hypothesis","statement":%s}' % NUL, "statement"),
        ("/v1/keys", b'{"name":%s,"budget_usd":0.01}' % NUL, "name"),
        ("/sandbox/sandboxes", b'{"templateID":"base","envVars":{"A":%s}}' % NUL, "envVars.A"),
    ]:
        response = _post(target, path, body)
        assert response.status_code == 422, f"{path}: {response.text}"
        assert response.json()["error"]["param"] == param and "NUL" in response.json()["error"]["message"]
        assert standard_error_problem(response) is None
    listed = httpx.get(target.url + "/records/v1/experiments", headers=_headers("/records/", target), timeout=30)
    assert all("\x00" not in row["name"] for row in listed.json()["data"])


def _sweep_path(path: str, target: Target) -> str:
    filled = path.replace("{key_id}", target.spare_key_id).replace("{action}", "pause")
    while "{" in filled:
        head, _, rest = filled.partition("{")
        filled = head + "x" + rest.partition("}")[2]
    return filled


@pytest.mark.parametrize("kind", [*BAD_TEXT, "lone surrogate in a key", "NUL"])
def test_no_route_breaks_on_text_no_parser_should_take(target: Target, kind: str) -> None:
    """Every route with a body, in every document, sent the bad text in a chat-shaped body (a
    model nobody serves, so nothing is generated): never a 5xx, every refusal the standard shape,
    and every route that documents a JSON body refuses it where the body is parsed."""
    if kind == "NUL":
        literal, status = NUL, 422
    elif kind == "lone surrogate in a key":
        literal, status = b'{"\\ud800":1}', 422
    else:
        literal, status = BAD_TEXT[kind]
    body = b'{"model":"nobody-serves-this","name":%s,"messages":[{"role":"user","content":%s}]}' % (literal, literal)
    problems, swept = [], 0
    for path, operations in sorted(target.spec["paths"].items()):
        for method, operation in operations.items():
            if method not in ("post", "put", "patch"):
                continue
            swept += 1
            response = _post(target, _sweep_path(path, target), body, method.upper())
            where = f"{method.upper()} {path} -> {response.status_code}"
            documented = "application/json" in (operation.get("requestBody") or {}).get("content", {})
            if response.status_code >= 500:
                problems.append(f"{where}: {response.text[:200]}")
            elif response.status_code >= 400 and (problem := standard_error_problem(response)):
                problems.append(f"{where}: {problem}")
            elif documented and kind != "NUL" and response.status_code not in (status, 404):  # 404: no such route
                problems.append(f"{where}, not {status}: {response.text[:200]}")
    assert swept > 30
    assert not problems, "\n".join(problems)


def test_a_daemon_rpc_message_that_cannot_be_decoded_is_the_callers_error(target: Target) -> None:
    """The sandbox daemon's Connect RPCs (in no document): a message that is not UTF-8, holds a
    lone surrogate or a wrong type was answered ``unknown`` (a 500); now ``invalid_argument``."""
    require_bwrap()
    made = httpx.post(f"{target.url}/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0}, headers=admin_headers(),
                      timeout=30)
    assert made.status_code == 201, made.text
    auth = {"X-API-Key": made.json()["key"]}  # a key of its own: the fuzzer's sandboxes hold the run key's slots
    created = httpx.post(f"{target.url}/sandbox/sandboxes", json={"templateID": "base", "timeout": 60},
                         headers=auth, timeout=60)
    assert created.status_code == 201, created.text
    sandbox = created.json()["sandboxID"]
    rpc = {**auth, "E2b-Sandbox-Id": sandbox, "Connect-Protocol-Version": "1"}
    try:
        for message in (rb'{"path":"\ud800"}', b'{"path":"\xc0\xaf"}', b'{"path":5}', b'{"path":"/tmp","depth":-1}'):
            answer = httpx.post(f"{target.url}/sandbox/envd/filesystem.Filesystem/ListDir", content=message,
                                headers={**rpc, "Content-Type": "application/json"}, timeout=60)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_argument", (message, answer.text)
        streamed = rb'{"process":{"cmd":"/bin/echo","args":["\udfff"]}}'
        answer = httpx.post(f"{target.url}/sandbox/envd/process.Process/Start",
                            content=struct.pack(">BI", 0, len(streamed)) + streamed,
                            headers={**rpc, "Content-Type": "application/connect+json"}, timeout=60)
        assert answer.status_code == 200  # a stream's error is its end message
        assert b'"invalid_argument"' in answer.content, answer.content
    finally:
        httpx.delete(f"{target.url}/sandbox/sandboxes/{sandbox}", headers=auth, timeout=60)


ESCAPES = [rb"\\", rb"\ud83d", rb"\ude00", rb"\uD800", rb"\udc00", rb"\u0000", b"a", rb"\n", rb"\"", "\U0001f600".encode()]


@settings(max_examples=3000, derandomize=True, deadline=None, database=None)
@given(parts=strategies.lists(strategies.sampled_from(ESCAPES), max_size=10))
def test_the_quick_look_for_unholdable_text_never_misses(parts: list[bytes]) -> None:
    """The parse walks a body's strings only when a C-speed search of its bytes finds an escape
    that may decode to NUL or a lone surrogate: that search never misses one (an escaped backslash
    before ``u``, or between the halves of a pair, does not fool it) and never walks a body of
    valid pairs. ``unholdable`` on the parsed value is the truth."""
    raw = b'{"k":"' + b"".join(parts) + b'"}'
    truth = unholdable(json.loads(raw)) is not None
    assert request_json._suspect(raw) == truth, raw


@pytest.mark.parametrize(("method", "path", "status", "param"), [
    ("GET", "/records/v1/experiments/exp%00x", 404, None),
    ("GET", "/training/v1/jobs/job%00x", 404, None),
    ("GET", "/evaluation/v1/jobs/job%00x", 404, None),
    ("GET", "/sandbox/sandboxes/sbx%00x", 404, None),
    ("POST", "/v1/keys/key%00x/revoke", 404, None),
    ("GET", "/admin/v1/keys/key%00x", 404, None),
    ("GET", "/admin/v1/training/jobs?status=queued&run_id=key%00x", 422, "run_id"),
])
def test_an_id_holding_nul_is_not_found_on_postgresql(make_gym: Any, pg_store: Store, method: str, path: str,
                                                      status: int, param: str | None) -> None:
    """Found with the bodies: PostgreSQL takes no NUL in a query parameter, so a lookup of an id
    holding one was a 500 on every route (SQLite only answered 404). Refused at the gateway's door."""
    with serve_gym(make_gym(store=pg_store)) as url, httpx.Client(base_url=url, timeout=30) as client:
        made = client.post("/admin/v1/keys", json={"track": "joint", "budget_usd": 1.0}, headers=admin_headers())
        auth = admin_headers() if path.startswith("/admin/") else {"Authorization": f"Bearer {made.json()['key']}"}
        response = client.request(method, path, headers=auth)
    assert response.status_code == status, response.text
    assert standard_error_problem(response) is None and response.json()["error"]["param"] == param
