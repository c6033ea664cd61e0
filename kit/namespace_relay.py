"""Runs inside the launcher's namespaces (stdlib only, under the system python): the agent's one
way out. Listens on 127.0.0.1:PORT and relays each connection to the bind-mounted Unix socket the
launcher's supervisor serves (which forwards to the gateway); likewise ``--egress-port`` to the
supervisor's egress proxy (kit/egress.py) when the task allows any host; then runs the agent command and exits
with its status; with ``--seconds`` the command is killed when they pass (a template build's limit;
a launched run's clock is its supervisor's, ops/run_watch.py)."""

import argparse
import asyncio
import os
import signal
import sys

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        try:
            writer.close()
        except ConnectionError:
            pass


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: str) -> None:
    try:
        up_r, up_w = await asyncio.open_unix_connection(target)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--egress-port", type=int, default=None)
    parser.add_argument("--egress-socket", default=None)
    parser.add_argument("--seconds", type=float, default=None, help="stop the command after this long (default: never; "
                        "the launcher's supervisor owns a run's clock, ops/run_watch.py)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    server = await asyncio.start_server(lambda r, w: _forward(r, w, args.socket), "127.0.0.1", args.port)
    if args.egress_port and args.egress_socket:  # the task's egress allowlist, enforced outside
        await asyncio.start_server(lambda r, w: _forward(r, w, args.egress_socket), "127.0.0.1", args.egress_port)
    async with server:
        # bwrap's --chdir sets PWD and this interpreter's locale coercion (PEP 538) sets LC_CTYPE: not the agent's
        env = {k: v for k, v in os.environ.items() if k not in {"PWD", "LC_CTYPE"}}
        try:
            agent = await asyncio.create_subprocess_exec(*command, start_new_session=True, env=env)
        except (FileNotFoundError, PermissionError) as err:  # the shell's 127 and 126: the agent never ran
            print(f"rsigym: the agent's command cannot be run: {err}", file=sys.stderr, flush=True)
            return 127 if isinstance(err, FileNotFoundError) else 126
        try:
            return await asyncio.wait_for(agent.wait(), timeout=None if args.seconds is None else max(args.seconds, 0.0))
        except TimeoutError:
            print("rsigym: the run's wall clock has passed; the agent is stopped", file=sys.stderr, flush=True)
            os.killpg(agent.pid, signal.SIGKILL)
            await agent.wait()
            return 124


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
