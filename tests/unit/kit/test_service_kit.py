"""The service kit: every service has the same shape, and the seams hold.

* each ``services/<svc>/spec.py`` is light: importing it (as the gateway does) pulls in no
  app, router, service logic, backend, torch or harbor;
* each spec declares exactly the routes its app serves;
* backends are picked through one registry per extension point;
* the training step loop (metering, cancel, checkpoints, failures) exists once, for any
  ``Trainer``;
* policies cross the gateway boundary typed, and a body that fails validation is a 422 in
  the one error shape, whichever service refuses it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from access.keys import KeyRegistry
from access.policy import Policy, ServicePolicy
from access.presets import preset_policy
from billing.ledger import Ledger, StepMeter
from billing.money import token_cost_nusd
from kit.backends import Registry, UnknownBackend
from kit.config import GymConfig
from kit.identity import Identity, sign, verify
from kit.settings import StoreSettings
from ops.builder import SERVICES, Gym, service_modules
from services.training.schemas import JobRequest
from services.training.trainer import Resume, StepReport, StepResult, TrainerError, TrainingInputs, run_training
from storage.store import Store, sqlite_url
from storage.tables import ApiKey
from tests.conftest import bearer, client_for, create_key

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "harbor", "peft", "transformers", "litellm", "e2b", "vllm", "tinker")


# -- spec modules are light ------------------------------------------------------------------------


def _imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _forbidden(service: str, modules: set[str]) -> list[str]:
    own = (f"services.{service}.app", f"services.{service}.api", f"services.{service}.service",
           f"services.{service}.backends")
    return sorted(m for m in modules
                  if m.split(".")[0] in HEAVY or any(m == o or m.startswith(o + ".") for o in own))


@pytest.mark.parametrize("service", SERVICES)
def test_a_spec_module_imports_no_app_router_service_backend_torch_or_harbor(service: str) -> None:
    modules = _imported_after(f"import services.{service}.spec as m\nassert m.SPEC.name == {service!r}")
    assert f"services.{service}.spec" in modules
    assert _forbidden(service, modules) == []


def test_the_gateway_reaches_every_spec_without_importing_a_service() -> None:
    modules = _imported_after("from ops.builder import service_modules\n"
                              "specs = {n: m.SPEC for n, m in service_modules().items()}\n"
                              "import gateway.app, gateway.proxy, gateway.admin")
    assert {f"services.{s}.spec" for s in SERVICES} <= modules
    assert {s: _forbidden(s, modules) for s in SERVICES} == {s: [] for s in SERVICES}


# -- spec and router declare the same routes ---------------------------------------------------------


def _norm(path: str) -> str:
    return re.sub(r"\{[^}/]+\}", "{}", path)


def _routes_of(routes: list[Any], prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every endpoint, through included routers (FastAPI ≥ 0.165 keeps an
    included router as one route that holds the original router and its include prefix)."""
    from fastapi.routing import APIRoute

    found: set[tuple[str, str]] = set()
    for r in routes:
        if isinstance(r, APIRoute):
            found |= {(m, _norm(prefix + r.path)) for m in r.methods if m != "HEAD"}
        elif (inner := getattr(r, "original_router", None)) is not None:
            found |= _routes_of(inner.routes, prefix + getattr(r.include_context, "prefix", ""))
    return found


def _served_routes(gym: Gym, service: str) -> set[tuple[str, str]]:
    app = gym.service_apps[service]
    inner = getattr(app, "app", app)  # the sandbox's envd dispatcher wraps its FastAPI app
    routes = _routes_of(inner.routes) - {("GET", "/healthz")}
    for prefix in getattr(app, "connect", {}):  # Connect RPCs the dispatcher serves under /envd
        routes.add(("POST", _norm(f"/envd{prefix}{{method}}")))
    return routes


@pytest.mark.parametrize("service", SERVICES)
def test_spec_and_router_declare_the_same_routes(gym: Gym, service: str) -> None:
    spec = service_modules()[service].SPEC
    declared = [(op.method, _norm(op.path)) for op in (*spec.operations, *spec.operator_operations)]
    if service == "rollout":  # it also serves the research agent's own model under /agent (its own spec)
        from services.rollout.agent_spec import PREFIX
        from services.rollout.agent_spec import SPEC as AGENT_SPEC

        declared += [(op.method, _norm(PREFIX + op.path)) for op in AGENT_SPEC.operations]
    if service == "inference":  # ... and so does inference, for the agent models the gym serves itself
        from services.inference.agent_spec import PREFIX as GYM_PREFIX
        from services.inference.agent_spec import SPEC as GYM_AGENT_SPEC
        from services.inference.agent_spec import refuse_dialect

        # the other dialects are declared only to be refused at the gateway (422): never forwarded, not served
        declared += [(op.method, _norm(GYM_PREFIX + op.path)) for op in GYM_AGENT_SPEC.operations
                     if op.estimate is not refuse_dialect]
    served = _served_routes(gym, service)
    assert len(served) > 1
    assert sorted(set(declared)) == sorted(served)
    # The gateway forwards by the spec: every served path matches exactly the declared operation.
    for op in spec.operations:
        concrete = re.sub(r"\{[^}/]+\}", "x1", op.path)
        assert spec.match(op.method, concrete) is op


def test_operator_routes_are_never_matched_for_a_run_key() -> None:
    spec = service_modules()["evaluation"].SPEC
    assert spec.operator_operations
    for op in spec.operator_operations:
        assert spec.match(op.method, re.sub(r"\{[^}/]+\}", "run_1", op.path)) is None


# -- one registry per extension point ---------------------------------------------------------------


def test_registry_lists_known_names_and_imports_lazy_entries_once() -> None:
    reg: Registry[Any] = Registry("widget", lazy={"json": "json"})
    reg.register("a")(1)
    assert reg.get("a") == 1 and "json" in reg and reg.names() == ["a", "json"]
    with pytest.raises(UnknownBackend) as info:
        reg.get("nope")
    assert "no widget backend named 'nope'; known: a, json" == info.value.message
    with pytest.raises(UnknownBackend):
        reg.get("json")  # the module was imported but registered nothing under that name
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(2)


def test_every_backend_name_the_config_allows_has_a_registered_implementation() -> None:
    from typing import get_args

    from kit.config import BaseModel_, RolloutConfig, SandboxConfig
    from services.inference.backends import ENGINES
    from services.rollout.backends import ROLLOUT_BACKENDS
    from services.sandbox.backends import SANDBOX_BACKENDS
    from services.training.backends import TRAINERS

    def allowed(model: Any) -> set[str]:
        return set(get_args(model.model_fields["backend"].annotation))

    assert allowed(BaseModel_) == set(ENGINES.names()) == set(TRAINERS.names()) == {"local", "vllm", "tinker"}
    assert allowed(SandboxConfig) == set(SANDBOX_BACKENDS.names())
    assert allowed(RolloutConfig) == set(ROLLOUT_BACKENDS.names())
    from services.training.backends.local import make_local
    from services.training.backends.tinker import make_tinker

    assert TRAINERS.get("local") is make_local and TRAINERS.get("vllm") is make_local
    assert TRAINERS.get("tinker") is make_tinker


# -- one training step loop, any Trainer --------------------------------------------------------------


class ScriptedTrainer:
    """A Trainer whose steps are scripted: what the loop does around them is under test."""

    def __init__(self, tokens: int = 1000, fail_at: int | None = None, fail_after_work: bool = False,
                 fail_prepare: str | None = None, fail_save: bool = False):
        self.tokens, self.fail_at, self.fail_after_work = tokens, fail_at, fail_after_work
        self.fail_prepare, self.fail_save = fail_prepare, fail_save
        self.stepped: list[int] = []
        self.saved: list[int] = []
        self.closed = 0

    def prepare(self, inputs: TrainingInputs) -> None:
        if self.fail_prepare:
            raise TrainerError(self.fail_prepare)

    def next_batch(self) -> int:
        return self.tokens

    def batch_tokens(self, batch: int) -> int:
        return batch

    def step(self, batch: int, step: int, paid: Any) -> StepResult:
        if step == self.fail_at:
            paid.performed = self.fail_after_work
            raise TrainerError("the backend fell over")
        paid.performed = True
        self.stepped.append(step)
        return StepResult(loss=1.0 / step, lr=0.1, grad_norm=0.5)

    def save(self, step: int) -> str:
        if self.fail_save:
            raise TrainerError("disk full")
        self.saved.append(step)
        return f"weights@{step}"

    def save_state(self, directory: Path) -> None:
        pass

    def restored(self) -> str:
        return "nothing"

    def close(self) -> None:
        self.closed += 1


PRICE = 2.0


@pytest.fixture
def ledger_store(tmp_path: Path) -> Any:
    store = Store(sqlite_url(tmp_path), StoreSettings())
    store.migrate()
    yield store
    store.dispose()


def _run(store: Store, trainer: ScriptedTrainer, budget_steps: float, steps: int = 10, every: int = 4,
         stop_after: int | None = None, resume: Resume | None = None,
         ) -> tuple[Any, list[StepReport], list[tuple[Any, int]], str]:
    cost = token_cost_nusd(trainer.tokens, PRICE)
    view, _ = KeyRegistry(store).create(policy=preset_policy("joint", GymConfig()), budget_nusd=int(budget_steps * cost))
    reports: list[StepReport] = []
    ckpts: list[tuple[Any, int]] = []
    request = JobRequest.model_validate({"datasets": ["ds"], "base_model": "tiny", "steps": steps,
                                         "checkpoint_every": every})
    outcome = run_training(
        trainer, TrainingInputs(model_dir="-", parent_adapter=None, pairs=[], request=request, steps=steps,
                                resume=resume),
        train_usd_per_mtok=PRICE, meter=StepMeter(Ledger(store), view["id"], "training", "train_step", ref_id="j"),
        on_step=reports.append, on_checkpoint=lambda weights, step, metrics: ckpts.append((weights, step)),
        should_stop=lambda: stop_after is not None and len(reports) >= stop_after)
    return outcome, reports, ckpts, view["id"]


def _account(store: Store, key_id: str) -> tuple[int, int]:
    with store.transaction() as s:
        row = s.get(ApiKey, key_id)
        return row.spent_nusd, row.reserved_nusd


def test_the_loop_meters_each_step_and_stops_where_the_budget_cannot_pay(ledger_store: Store) -> None:
    trainer = ScriptedTrainer()
    cost = token_cost_nusd(trainer.tokens, PRICE)
    outcome, reports, ckpts, key = _run(ledger_store, trainer, budget_steps=5.5)
    assert (outcome.status, outcome.steps) == ("budget_exhausted", 5)
    assert outcome.error == "the budget could not pay for step 6; stopped after 5 steps"
    assert trainer.stepped == [1, 2, 3, 4, 5]  # step 6 never reached the backend
    assert [(r.step, r.tokens, r.cost_nusd) for r in reports] == [(s, 1000, cost) for s in range(1, 6)]
    assert _account(ledger_store, key) == (5 * cost, 0)
    assert ckpts == [("weights@4", 4), ("weights@5", 5)]  # cadence, then the last performed step
    assert trainer.closed == 1


def test_the_loop_succeeds_cancels_and_never_saves_a_step_twice(ledger_store: Store) -> None:
    done, _, ckpts, _ = _run(ledger_store, ScriptedTrainer(), budget_steps=100, steps=8, every=4)
    assert (done.status, done.steps, done.error) == ("succeeded", 8, None)
    assert [s for _, s in ckpts] == [4, 8]
    cancelled, reports, ckpts, key = _run(ledger_store, ScriptedTrainer(), budget_steps=100, stop_after=3)
    assert (cancelled.status, cancelled.steps) == ("cancelled", 3) and len(reports) == 3
    assert [s for _, s in ckpts] == [3]
    assert _account(ledger_store, key)[1] == 0


@pytest.mark.parametrize("after_work", [False, True])
def test_a_failing_step_fails_the_job_and_is_billed_only_if_work_happened(ledger_store: Store, after_work: bool) -> None:
    trainer = ScriptedTrainer(fail_at=3, fail_after_work=after_work)
    cost = token_cost_nusd(trainer.tokens, PRICE)
    outcome, reports, ckpts, key = _run(ledger_store, trainer, budget_steps=100)
    assert (outcome.status, outcome.steps, outcome.error) == ("failed", 2, "step 3: the backend fell over")
    assert len(reports) == 2 and [s for _, s in ckpts] == [2]
    assert _account(ledger_store, key) == ((3 if after_work else 2) * cost, 0)


def test_a_resumed_loop_continues_after_its_checkpoint_and_bills_each_step_once(ledger_store: Store) -> None:
    # The dead worker had billed steps 1-6 (7 and 8 at other prices); its checkpoint was at step 4.
    trainer = ScriptedTrainer()
    cost = token_cost_nusd(trainer.tokens, PRICE)
    resume = Resume(step=4, adapter="ckpt@4", state="state@4", billed_nusd=[777, 888])
    outcome, reports, ckpts, key = _run(ledger_store, trainer, budget_steps=3.5, steps=10, every=4, resume=resume)
    assert trainer.stepped == [5, 6, 7, 8, 9]  # from the step after the checkpoint, never from 1
    assert [(r.step, r.cost_nusd, r.replayed) for r in reports] == [
        (5, 777, True), (6, 888, True), (7, cost, False), (8, cost, False), (9, cost, False)]
    # 5 and 6 ran again unmetered (the agent paid for them once, before); the steps after them are
    # billed: this budget pays for three, so step 10 is refused.
    assert (outcome.status, outcome.steps) == ("budget_exhausted", 9)
    assert _account(ledger_store, key) == (3 * cost, 0)
    assert ckpts == [("weights@8", 8), ("weights@9", 9)]  # the resumed checkpoint is not written again


def test_prepare_and_final_save_failures_are_outcomes_not_crashes(ledger_store: Store) -> None:
    refused = ScriptedTrainer(fail_prepare="no example has an answer within max_length tokens")
    outcome, reports, _, key = _run(ledger_store, refused, budget_steps=100)
    assert (outcome.status, outcome.steps, outcome.error) == ("failed", 0, refused.fail_prepare)
    assert reports == [] and _account(ledger_store, key) == (0, 0) and refused.closed == 1
    unsaved = ScriptedTrainer(fail_save=True)
    outcome, _, _, _ = _run(ledger_store, unsaved, budget_steps=100, steps=3, every=10)
    assert outcome.status == "failed" and outcome.steps == 3
    assert outcome.error == "the last checkpoint (step 3) could not be saved: disk full"


# -- typed policies across the gateway boundary -----------------------------------------------------


def test_policies_cross_the_signed_boundary_typed() -> None:
    policy = Policy.model_validate({"services": {"inference": {"models": ["tiny"], "cross_run": True,
                                                               "fields": {"temperature": {"range": [0, 1]}}}}})
    identity = Identity(request_id="req_1", key_id="k", run_id="r", service="inference", operation="chat",
                        policies=[policy.services["inference"]], issued_at=time.time())
    headers = sign(identity, "s3cret", "POST", "/v1/chat/completions", b"{}")
    got = verify(headers, "s3cret", "POST", "/v1/chat/completions", b"{}")
    assert isinstance(got.policies[0], ServicePolicy)
    assert got.policies[0] == policy.services["inference"] and got.policies[0].allows_model("tiny")
    assert not got.policies[0].allows_model("other")


# -- one status for a body that fails validation ----------------------------------------------------

BAD_BODIES = [
    ("rollout", "/rollout/v1/chat/completions", {"model": "teacher", "messages": "hi"}, "messages"),
    ("inference", "/inference/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user"}],
                                                      "max_tokens": "many"}, "max_tokens"),
    ("training", "/training/v1/jobs", {"datasets": ["ds_x"], "base_model": "tiny", "steps": -1}, "steps"),
    ("evaluation", "/evaluation/v1/jobs", {"benchmark": "arith", "model": "tiny", "attempts": 99}, "attempts"),
    ("sandbox", "/sandbox/v2/sandboxes", {"templateID": "base", "timeout": "soon"}, "timeout"),
]


@pytest.mark.parametrize("service, path, body, param", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_a_bad_body_is_a_422_in_the_error_shape_in_every_service(gym: Gym, service: str, path: str,
                                                                  body: dict[str, Any], param: str) -> None:
    client = client_for(gym)
    run = create_key(client, budget_usd=1.0)
    headers = {"X-API-Key": run["key"]} if service == "sandbox" else bearer(run["key"])
    for sent in (json.dumps(body).encode(), b'{"model": "tiny", "messages": [', b"[1, 2]"):
        r = client.post(path, content=sent, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 422, (service, sent, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert err["error"]["message"] and err["request_id"] == r.headers["x-request-id"]
        if sent == json.dumps(body).encode():
            assert param in (err["error"]["param"] or ""), err
    balance = client.get("/v1/balance", headers=bearer(run["key"])).json()
    assert balance["reserved_usd"] == 0 and balance["spent_usd"] == 0


def test_no_app_of_the_gym_runs_fastapi_telemetry(gym: Gym, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gym's metrics are Prometheus; FastAPI's native OpenTelemetry is off in every app, so a
    request pays no provider lookups (kit/http.py ``NO_FASTAPI_TELEMETRY``) and an
    OpenTelemetry provider set in the process records no span of the gym's calls."""
    from opentelemetry import trace

    started: list[str] = []

    class Recording(trace.NoOpTracer):
        def start_span(self, name: str, *args: Any, **kwargs: Any) -> trace.Span:
            started.append(name)
            return super().start_span(name, *args, **kwargs)

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
            return Recording()

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", Provider())
    for name, app in {"gateway": gym.app, **gym.service_apps}.items():
        app = app.state.direct_app if name != "gateway" else app  # the sandbox's FastAPI app sits inside its door
        assert not app._native_telemetry.enabled(), name
    client = client_for(gym)
    key = create_key(client)["key"]
    assert client.get("/v1/balance", headers=bearer(key)).status_code == 200
    assert started == []
