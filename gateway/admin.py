"""Operator routes (admin token): run keys, budgets, policies, ledgers."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from access.generations import InitialSystem, initial_system, with_initial_checkpoint
from access.policy import Policy
from access.presets import budget_usd, preset_policy, track_label
from billing import agent_meter, spend
from billing.deadlines import resolve_ends_at
from billing.money import nusd_to_usd, usd_to_nusd
from billing.storage_quota import StorageQuota
from gateway.auth import require_admin
from gateway.context import gateway_of
from gateway.proxy import operator_call
from gateway.run_end import end_expired_runs
from gateway.run_jobs import running_jobs
from gateway.run_monitor import monitor_round
from gateway.run_progress import with_run_progress
from gateway.schemas import CreateKey, EditPolicy, EndRun, SetDeadline, TopUp
from kit.errors import PermissionDenied, Unprocessable, validated
from kit.http import TextJsonRoute, request_id_of
from kit.spec import ServiceSpec
from services.inference.read import check_new_run_agent_model
from services.records import read as records_read
from services.records.read import accepted_system
from storage.store import Store

router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_admin)], route_class=TextJsonRoute)


def parse_policy(raw: dict[str, Any], specs: dict[str, ServiceSpec]) -> Policy:
    """A policy whose field rules name fields as request bodies spell them after the gateway's
    canonicalisation: a rule on ``template_id`` would never see a body (it says ``templateID``)."""
    policy = validated(Policy, raw, what="policy", error=Unprocessable, prefix="policy.")
    for name, rules in policy.services.items():
        spec = specs.get(name)
        for path in rules.fields:
            canonical = spec.canonical_rule_path(path) if spec else path
            if canonical != path:
                raise Unprocessable(f"policy rule on {path!r}: this field is spelled {canonical!r}; write the rule "
                                    f"on {canonical!r}", param=f"policy.services.{name}.fields.{path}")
    return policy


@router.post("/keys", status_code=201)
async def create_key(body: CreateKey, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    if body.track is None and body.policy is None:
        raise Unprocessable("give a track (a preset), a policy, or both (a policy within the track's preset)",
                            param="track")
    if body.offline and body.track is None:
        raise Unprocessable("offline is a modifier on a track; give a track", param="offline")
    if (body.budget_usd is None) == (body.budget is None):
        raise Unprocessable("give exactly one of budget_usd or budget (a named budget of the track)", param="budget_usd")
    usd = body.budget_usd if body.budget_usd is not None else budget_usd(body.track, body.budget or "")
    if body.track:
        policy, track = preset_policy(body.track, gw.config, offline=body.offline), track_label(body.track, body.offline)
        if body.policy is not None:  # a task narrows its track (e.g. a token rate): never wider than the preset
            narrowed = parse_policy(body.policy, gw.specs).inheriting_limits(policy)
            try:
                narrowed.assert_within(policy)
            except PermissionDenied as err:
                raise Unprocessable(f"the policy is wider than the {track} preset: {err.message}",
                                    param=f"policy.{err.param}" if err.param else "policy") from err
            policy = narrowed
    else:
        policy, track = parse_policy(body.policy or {}, gw.specs), None
    ends_at = resolve_ends_at(body.ends_at, body.deadline_s)
    from_run = body.run.from_run if body.run is not None else None
    if body.run is not None and body.run.agent_model:  # a gym-served agent model it may never use: refused now
        await gw.store.call(check_new_run_agent_model, gw.context, body.run.agent_model)
    if from_run is not None:  # the fixed base follows the system it starts from (checked again with the key)
        policy = with_initial_checkpoint(policy, await gw.store.call(_initial_system, gw.store, from_run))
    view, plaintext = await gw.store.call(
        partial(gw.registry.create, policy=policy, budget_nusd=usd_to_nusd(usd), track=track, name=body.name,
                ends_at=ends_at, run=body.run.model_dump(exclude={"from_run"}) if body.run is not None else None,
                from_run=from_run, accepted_system=accepted_system if from_run is not None else None)
    )
    if body.agent_budget_usd is not None:
        meter = await gw.store.call(partial(agent_meter.attach_meter, gw.store, view["id"],
                                            usd_to_nusd(body.agent_budget_usd)))
        view = {**view, "agent_meter_id": meter["id"], "agent_budget_usd": meter["budget_usd"]}
    return {**view, "key": plaintext}


def _initial_system(store: Store, from_run: str) -> InitialSystem:
    """``from_run``'s accepted system, or its refusal (404 unknown, 409 running / unaudited /
    unscored / flagged) before a key is minted."""
    with store.transaction() as s:
        return initial_system(s, from_run, accepted_system)


@router.get("/keys")
async def list_keys(request: Request, parent_id: str | None = None) -> dict[str, Any]:
    gw = gateway_of(request)
    views = await gw.store.call(partial(gw.registry.list, parent_id=parent_id))
    return {"data": await gw.store.call(with_run_progress, gw.store, views)}


@router.get("/keys/{key_id}")
async def show_key(key_id: str, request: Request) -> dict[str, Any]:
    """The key, and its run's disk use (``storage``, billing/storage_quota.py)."""
    gw = gateway_of(request)
    [view] = await gw.store.call(with_run_progress, gw.store, [await gw.store.call(gw.registry.get, key_id)])
    return {**view, "storage": await gw.store.call(StorageQuota.of(gw.context).usage, view["run_id"])}


@router.patch("/keys/{key_id}")
async def edit_policy(key_id: str, body: EditPolicy, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.set_policy, key_id, parse_policy(body.policy, gw.specs))


@router.post("/keys/{key_id}/topup")
async def topup(key_id: str, body: TopUp, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.topup, key_id, usd_to_nusd(body.amount_usd))


@router.post("/keys/{key_id}/deadline")
async def set_deadline(key_id: str, body: SetDeadline, request: Request) -> dict[str, Any]:
    """Set, move or clear a run's wall-clock deadline (declared before ``/keys/{key_id}/{action}``).
    A deadline in the past ends the run: its keys are refused at once and the reaper's next
    round stops its jobs and sandboxes."""
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.set_deadline, key_id, resolve_ends_at(body.ends_at, body.deadline_s))


@router.post("/keys/{key_id}/start")
async def start_run(key_id: str, request: Request) -> dict[str, Any]:
    """The launcher's supervisor reports the run's agent started (``created`` → ``running``; the
    wall clock counts from now). Declared before ``/keys/{key_id}/{action}``."""
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.start_run, key_id)


@router.post("/keys/{key_id}/end")
async def end_run(key_id: str, body: EndRun, request: Request) -> dict[str, Any]:
    """End a run now and record why (declared before ``/keys/{key_id}/{action}``): the launcher's
    supervisor when the agent exits or never starts, ``rsigym run stop``. Its keys are refused at
    once, the reaper's next round stops its jobs and sandboxes, its unspent budget stays unspent."""
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.end_run, key_id, body.reason, body.agent_exit)


@router.post("/keys/{key_id}/{action}")
async def change_status(key_id: str, action: str, request: Request) -> dict[str, Any]:
    statuses = {"pause": "paused", "resume": "active", "revoke": "revoked"}
    if action not in statuses:
        raise Unprocessable(f"unknown action {action!r}; expected pause, resume, revoke or topup", param="action")
    gw = gateway_of(request)
    return await gw.store.call(gw.registry.set_status, key_id, statuses[action])


@router.get("/keys/{key_id}/ledger")
async def ledger(key_id: str, request: Request) -> dict[str, Any]:
    gw = gateway_of(request)
    return {"data": await gw.store.call(gw.ledger.entries, key_id)}


@router.get("/spend")
async def spend_by(request: Request, by: str = "model", run_id: str | None = None, limit: int = 1000) -> dict[str, Any]:
    """What runs were charged, from the ledger: ``by=model`` (per model and service) or ``by=key``
    (per key and model), most first; ``run_id`` narrows to one run's keys (billing/spend.py)."""
    if by not in ("model", "key"):
        raise Unprocessable(f"unknown grouping {by!r}; expected model or key", param="by")
    if limit < 1:
        raise Unprocessable("limit must be at least 1", param="limit")
    gw = gateway_of(request)
    rows = await gw.store.call(spend.charged, gw.store, run_id)
    if by == "model":
        data = spend.by_model(rows, limit)
    else:
        data = await gw.store.call(spend.with_names, gw.store, spend.by_key(rows, limit))
    return {"by": by, "run_id": run_id, "total_usd": nusd_to_usd(sum(r.nusd for r in rows)),
            "data": [{k: v for k, v in item.items() if k != "charged_nusd"} for item in data]}


@router.post("/reclaim")
async def reclaim(request: Request) -> dict[str, int]:
    """Close expired reservations and concurrency slots of crashed holders now."""
    gw = gateway_of(request)
    return {
        "reservations": await gw.store.call(gw.ledger.reclaim_expired),
        "slots": await gw.store.call(gw.slots.reclaim_expired),
    }


@router.post("/runs/end-expired")
async def end_expired(request: Request) -> dict[str, Any]:
    """End every run whose deadline has passed now, without waiting for the reaper's round."""
    return {"data": await end_expired_runs(gateway_of(request))}


@router.get("/datasets/{dataset_id}/content")
async def audit_dataset(dataset_id: str, request: Request) -> Response:
    """Auditors read any run's uploaded data with the operator token."""
    upstream = await operator_call(gateway_of(request), "training", "GET", f"/v1/datasets/{dataset_id}/content",
                                   request_id_of(request))
    return Response(upstream.content, status_code=upstream.status_code,
                    media_type=upstream.headers.get("content-type", "application/json"))


# -- evaluation: benchmarks, scoring (forwarded to the evaluation service as the operator) --


async def _to_service(request: Request, service: str, method: str, path: str) -> Response:
    gw = gateway_of(request)
    body = await request.body() if method == "POST" else b""
    query = request.url.query
    upstream = await operator_call(gw, service, method, path, request_id_of(request), body, query=query)
    return Response(upstream.content, status_code=upstream.status_code,
                    media_type=upstream.headers.get("content-type", "application/json"))


async def _to_evaluation(request: Request, method: str, path: str) -> Response:
    return await _to_service(request, "evaluation", method, path)


@router.post("/benchmarks")
async def register_benchmark(request: Request) -> Response:
    """Register a benchmark from a directory or .tar.gz on the gym's host; validation runs async."""
    return await _to_evaluation(request, "POST", "/v1/operator/benchmarks")


@router.get("/benchmarks")
async def list_benchmarks(request: Request) -> Response:
    return await _to_evaluation(request, "GET", "/v1/benchmarks")


@router.post("/runs/{run_id}/score")
async def score_run(run_id: str, request: Request) -> Response:
    """Score a run's latest submission (official splits, avg@3) on the operator's budget."""
    return await _to_evaluation(request, "POST", f"/v1/operator/runs/{run_id}/score")


@router.get("/scores")
async def scores(request: Request) -> Response:
    return await _to_evaluation(request, "GET", "/v1/operator/scores")


@router.get("/evaluation/jobs/{job_id}")
async def evaluation_job(job_id: str, request: Request) -> Response:
    return await _to_evaluation(request, "GET", f"/v1/jobs/{job_id}")


@router.get("/evaluation/jobs/{job_id}/results")
async def evaluation_results(job_id: str, request: Request) -> Response:
    return await _to_evaluation(request, "GET", f"/v1/jobs/{job_id}/results")


# -- records: a run's platform events, experiments, chain check and audits (as the operator) --


@router.post("/runs/{run_id}/audit")
async def audit_run(run_id: str, request: Request) -> Response:
    """Audit a run: contamination, provenance, harness and behaviour checks; sets experiment
    statuses and returns the verdict (body: optional {"trajectory": "<the agent's trajectory>"})."""
    return await _to_service(request, "records", "POST", f"/v1/operator/runs/{run_id}/audit")


@router.get("/audits")
async def audits(request: Request) -> Response:
    """Stored audits, newest first (``?run_id=`` for one run's)."""
    return await _to_service(request, "records", "GET", "/v1/operator/audits")


@router.post("/monitor/round")
async def monitor_now(request: Request) -> dict[str, Any]:
    """A live-monitor round now (the reaper starts one every round when ``monitor.enabled``): each
    due run's new agent turns judged; a run with an EXECUTED behaviour is paused and alerted."""
    return await monitor_round(gateway_of(request))


@router.get("/alerts")
async def monitor_alerts(request: Request, run_id: str | None = None, limit: int = 100) -> dict[str, Any]:
    """The live monitor's alerts, newest first (``?run_id=`` for one run's)."""
    if not 1 <= limit <= 1000:
        raise Unprocessable("limit must be between 1 and 1000", param="limit")
    gw = gateway_of(request)

    def read() -> list[dict[str, Any]]:
        with gw.store.transaction() as s:
            return records_read.monitor_alerts(s, run_id, limit=limit)

    return {"object": "list", "data": await gw.store.call(read)}


@router.get("/runs/{run_id}/integrity")
async def run_integrity(run_id: str, request: Request) -> dict[str, Any]:
    """The run's live integrity (services/records/read.py ``run_integrity``): contamination hits
    at upload, provenance at submission, the newest audit, per run and per experiment; with
    ``checks``, the live checks themselves (evidence included). The operator's only."""
    gw = gateway_of(request)

    def read() -> dict[str, Any]:
        with gw.store.transaction() as s:
            return {"object": "integrity", "run_id": run_id, **records_read.run_integrity(s, run_id),
                    "checks": records_read.integrity_checks(s, run_id)}

    return await gw.store.call(read)


@router.get("/runs/{run_id}/jobs")
async def run_jobs(run_id: str, request: Request) -> dict[str, Any]:
    """The run's queued and running training and evaluation jobs with their progress (read
    from the store; declared before ``/runs/{run_id}/{what}``, as are the operator side's
    trajectory and timeline routes, ops/admin_routes.py)."""
    gw = gateway_of(request)
    return {"run_id": run_id, "data": await gw.store.call(running_jobs, gw.store, run_id)}


@router.get("/runs/{run_id}/{what}")
async def run_records(run_id: str, what: str, request: Request) -> Response:
    """A run's platform ``events``, ``experiments`` or ``chain`` (the hash chain's check)."""
    if what not in ("events", "experiments", "chain"):
        raise Unprocessable(f"unknown run record {what!r}; expected events, experiments or chain", param="what")
    return await _to_service(request, "records", "GET", f"/v1/operator/runs/{run_id}/{what}")
