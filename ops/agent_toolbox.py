"""The agents' toolbox: what a launched research agent may run besides the host's system programs,
installed once per host into one shared directory that the launcher binds read-only into every
run's namespace (ops/agent_namespace.py):

* ``python/`` — a virtual environment holding only the agent SDK, its MCP server (``gym``,
  ``gym mcp``: sdk/rsigym, with the pinned ``mcp`` SDK) and the unmodified clients the agent guide
  documents (``openai``, ``e2b``, the pinned ``tinker``: the SDK's ``clients`` extra), no server code. The launcher's namespace
  has only the host's system Python, which lacks the SDK's dependencies; this environment brings
  its own. A virtual environment is not relocatable (its scripts name their interpreter by
  absolute path) and uses the installing interpreter's standard library, so both are bound at
  the paths they have here (:func:`binds`).
* ``npm/`` — the pinned coding-agent CLIs from the npm registry (``npm`` in ops/agents.toml, e.g.
  Claude Code and Codex, whose packages ship native binaries), installed with ``npm install
  --prefix``.
* ``toolbox.json`` — what is installed (versions, the interpreter's prefix), read by the launcher.

``rsigym agents install NAME…`` builds it (``make install`` installs the CLIs the tests run);
``rsigym agents list`` shows it. Every file is root's (or the installing user's), 0755/0644: the
agent's uid reads and runs it and can change none of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kit.errors import ServiceUnavailable, Unprocessable

DIR_ENV = "RSIGYM_AGENTS_DIR"
"""Where the toolbox lives (default ``~/.local/share/rsigym/agents``)."""
MANIFEST = "toolbox.json"
SDK_SOURCE = Path(__file__).resolve().parents[1] / "sdk"
"""The agent SDK's source tree (installed into ``python/`` as a plain copy, not editable)."""
MCP_PIN = "mcp==2.3.0"
"""The MCP SDK the toolbox's ``gym mcp`` runs on (pinned as in pyproject.toml)."""
INSTALL_TIMEOUT_S = 900


def sdk_digest() -> str:
    """A digest of the agent SDK's source: a toolbox built from other source is stale."""
    digest = hashlib.sha256()
    for path in sorted([SDK_SOURCE / "pyproject.toml", *SDK_SOURCE.joinpath("rsigym").rglob("*.py")]):
        if path.is_file():
            digest.update(str(path.relative_to(SDK_SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def stale(root: Path | None = None) -> bool:
    """Whether the installed toolbox's SDK differs from this gym's (``rsigym agents install`` again)."""
    data = manifest(root)
    return data is not None and (data.get("python") or {}).get("sdk_digest") != sdk_digest()


def toolbox_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".local" / "share" / "rsigym" / "agents")


def manifest(root: Path | None = None) -> dict[str, Any] | None:
    """The installed toolbox's manifest, or None when nothing is installed there."""
    path = (root or toolbox_dir()) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _package_name(spec: str) -> str:
    """``@scope/name@1.2.3`` → ``@scope/name``."""
    head, sep, _ = spec.rpartition("@")
    return head if sep and head else spec


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ServiceUnavailable(f"{what} failed: {err}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ServiceUnavailable(f"{what} failed (exit {done.returncode}):\n{tail}")


def _install_python(root: Path) -> dict[str, Any]:
    if not (SDK_SOURCE / "pyproject.toml").is_file():
        raise Unprocessable(f"the agent SDK's source is not at {SDK_SOURCE}: install the toolbox from a checkout "
                            "of the gym")
    env = root / "python"
    if env.exists():
        shutil.rmtree(env)
    _run([sys.executable, "-m", "venv", str(env)], "creating the toolbox's Python environment")
    _run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir",
          f"{SDK_SOURCE}[mcp,clients]", MCP_PIN],
         "installing the agent SDK, its MCP server and the clients it documents (openai, e2b, tinker) into the toolbox")
    version = subprocess.run([str(env / "bin" / "gym"), "--version"], capture_output=True, text=True,
                             timeout=60, check=False).stdout.strip()
    return {"venv": str(env), "base_prefix": sys.base_prefix, "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "sdk": version, "sdk_digest": sdk_digest(), "bin": str(env / "bin")}


def _install_npm(root: Path, specs: list[str]) -> dict[str, str]:
    npm = shutil.which("npm")
    if npm is None:
        raise ServiceUnavailable("installing the agent CLIs needs npm (Node.js) on this host")
    prefix = root / "npm"
    prefix.mkdir(parents=True, exist_ok=True)
    _run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--omit=dev", "--no-save", *specs],
         f"npm install {' '.join(specs)}")
    installed = {}
    for spec in specs:
        name = _package_name(spec)
        try:
            installed[name] = json.loads((prefix / "node_modules" / name / "package.json").read_text())["version"]
        except (OSError, ValueError, KeyError):
            raise ServiceUnavailable(f"npm reported success but {name} is not in {prefix}") from None
    return installed


def install(specs: list[str], root: Path | None = None) -> dict[str, Any]:
    """Install (or reinstall) the Python environment and the npm packages ``specs`` (pinned, as
    ``name@version``) into the toolbox; the manifest afterwards. Packages installed earlier stay."""
    root = root or toolbox_dir()
    old_umask = os.umask(0o022)  # the agent's uid reads and runs all of it
    try:
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        previous = manifest(root) or {}
        python = _install_python(root)
        npm = dict(previous.get("npm") or {})
        if specs:
            npm |= _install_npm(root, specs)
        data = {"python": python, "npm": npm, "npm_bin": str(root / "npm" / "node_modules" / ".bin")}
        tmp = root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(root / MANIFEST)
        return data
    finally:
        os.umask(old_umask)


def missing(specs: list[str], root: Path | None = None) -> list[str]:
    """The pinned packages ``specs`` not installed (at that version) in the toolbox."""
    data = manifest(root) or {}
    npm = data.get("npm") or {}
    out = []
    for spec in specs:
        name = _package_name(spec)
        version = spec[len(name) + 1:] if spec != name else None
        if name not in npm or (version and npm[name] != version):
            out.append(spec)
    return out


def binds(root: Path | None = None) -> list[str]:
    """Host paths the namespace gets read-only at the same place: the toolbox and the Python
    environment's interpreter prefix (none when nothing is installed)."""
    root = root or toolbox_dir()
    data = manifest(root)
    if data is None:
        return []
    out = [str(root)]
    prefix = (data.get("python") or {}).get("base_prefix")
    if prefix and not any(prefix == d or prefix.startswith(d + "/") for d in ("/usr", "/bin", "/lib")):
        out.append(prefix)
    return out


def path_entries(root: Path | None = None) -> list[str]:
    """Where the toolbox's programs are (``gym``, ``claude``, ``codex`` …), for the agent's PATH."""
    data = manifest(root)
    if data is None:
        return []
    return [p for p in ((data.get("python") or {}).get("bin"), data.get("npm_bin")) if p]


def gym_command(root: Path | None = None) -> str:
    """The toolbox's ``gym`` (what MCP configurations name: an absolute path needs no PATH)."""
    bin_dir = (((manifest(root) or {}).get("python")) or {}).get("bin")
    return str(Path(bin_dir) / "gym") if bin_dir else "gym"
