"""What the command groups of ``rsigym`` share: the consoles, the options most commands take,
the gym's settings, the ``error:`` / ``note:`` lines, and the calls that turn a refusal (of the
admin API, or of the gym's own code) into a printed error and exit 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from kit.display_text import plain
from kit.errors import GymError
from kit.settings import GymSettings
from ops.cli.admin_client import AdminClient, AdminError

console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Gym data directory.")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Gateway URL (default RSIGYM_URL).")]
PollOpt = Annotated[float, typer.Option("--poll", help="Seconds between polls with --wait.")]
TasksDirOpt = Annotated[Path | None, typer.Option("--tasks-dir", help="Tasks root (default: the shipped tasks/).")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Gym config TOML (default RSIGYM_CONFIG): the "
                                                "models the track presets name.")]

T = TypeVar("T")


def gym_settings(data_dir: Path | None = None, config: Path | None = None) -> GymSettings:
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if config is not None:
        overrides["config"] = config
    return GymSettings(**overrides)


def print_error(text: Any) -> None:
    """``error: <text>`` on stderr. The text is shown as it is (kit/display_text.py): a
    gym's message may quote what an agent wrote, and is never read as markup."""
    err_console.print(Text.assemble(("error", "red"), ": ", plain(text)))


def print_note(text: Any) -> None:
    err_console.print(Text.assemble(("note", "yellow"), ": ", plain(text)))


def with_admin(data_dir: Path | None, url: str | None, fn: Callable[[AdminClient], T]) -> T:
    """Run ``fn`` with an admin client; an admin API error is printed and exits 1."""
    try:
        return fn(AdminClient(gym_settings(data_dir), url))
    except AdminError as err:
        rid = f" (request {err.request_id})" if err.request_id else ""
        print_error(f"{err.type}: {err.message}{rid}")
        raise typer.Exit(1) from None


def admin_request(method: str, path: str, data_dir: Path | None, url: str | None, **kwargs: Any) -> Any:
    return with_admin(data_dir, url, lambda client: client.request(method, path, **kwargs))


def exit_on_refusal(fn: Callable[[], T]) -> T:
    """Run ``fn``; a refusal (a gym error such as a bad task.toml or an unknown task or run, or an
    admin API error) is printed and exits 1."""
    try:
        return fn()
    except GymError as err:
        print_error(err.message)
        raise typer.Exit(1) from None
    except AdminError as err:
        print_error(f"{err.type}: {err.message}")
        raise typer.Exit(1) from None
