"""The two places a record chain's heads are anchored outside the store
(services/records/record_anchor.py has the why, the writer in front of them, and which one a gym
uses): an append-only, chain-sealed file in the data dir (embedded) and Redis (distributed).
Both keep every head anchored for a run, in order, past the last one only, and never change one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import threading
from array import array
from dataclasses import dataclass
from pathlib import Path

import redis

from kit.private_files import open_private, private_dir

GENESIS = "0" * 64
FILE_NAME = "record-anchor.log"


@dataclass(frozen=True, slots=True)
class Mark:
    """A chain head as the anchor holds it: the event's sequence number and its hash (the file
    keeps the hash's first 32 hex digits, :meth:`matches` compares either)."""

    seq: int
    hash: str

    def matches(self, event_hash: str) -> bool:
        return len(self.hash) >= 32 and event_hash[:len(self.hash)] == self.hash


class AnchorUnavailable(Exception):  # noqa: N818 - a state the check reports, not a refusal
    """The anchor cannot be read (unreachable, unreadable, or its own seals broken): chains
    cannot be checked against it."""


def seal(secret: bytes, *parts: object) -> str:
    return hmac.new(secret, "\n".join(str(p) for p in ("record-anchor/v1", *parts)).encode(),
                    hashlib.sha256).hexdigest()


# -- the file -------------------------------------------------------------------------------------


class _RunMarks:
    """One run's anchored heads, compactly (a process reads every line of the file): sequence
    numbers and each hash's first 16 bytes, in order."""

    __slots__ = ("digests", "seqs")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.digests = bytearray()

    def last(self) -> Mark | None:
        return Mark(self.seqs[-1], self.digests[-16:].hex()) if self.seqs else None

    def add(self, mark: Mark) -> None:
        self.seqs.append(mark.seq)
        self.digests += bytes.fromhex(mark.hash[:32])

    def marks(self) -> list[Mark]:
        return [Mark(seq, self.digests[i * 16:(i + 1) * 16].hex()) for i, seq in enumerate(self.seqs)]


class FileAnchor:
    """The append-only, chain-sealed file (see the module docstring). Several processes may write
    it: each takes an exclusive ``flock`` and reads what others appended before it writes, so the
    seals form one chain. Each process keeps an index of every run's heads, read incrementally;
    a file that shrinks or a line whose seal fails makes it unreadable for good."""

    def __init__(self, path: Path, secret: str):
        self.path = path
        self.where = f"file {path}"
        self._secret = secret.encode()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._offset = 0
        self._last_mac = GENESIS
        self._lines = 0
        self._index: dict[str, _RunMarks] = {}
        self._broken: str | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A child process takes its own lock and descriptor: ``flock`` is per open file, and the
        inherited one would not keep the parent and the child apart."""
        self._lock = threading.Lock()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def release(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _writer(self) -> int:
        if self._fd is None:
            private_dir(self.path.parent)
            self._fd = open_private(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return self._fd

    def _catch_up(self) -> None:
        """Read the lines appended since the last read (by any process), checking every seal."""
        if self._broken is not None:
            raise AnchorUnavailable(self._broken)
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            size = 0
        if size < self._offset:
            self._broken = f"the anchor file {self.path} lost {self._offset - size} bytes (truncated or replaced)"
            raise AnchorUnavailable(self._broken)
        if size == self._offset:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(size - self._offset)
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        for raw in complete.split(b"\n")[:-1]:
            self._offset += len(raw) + 1
            parsed = _parse(raw)
            if parsed is None:  # a torn line a crashed writer left: the seals chain across it
                continue
            run_id, mark, mac = parsed
            if not hmac.compare_digest(mac, seal(self._secret, self._last_mac, run_id, mark.seq, mark.hash)):
                self._broken = (f"line {self._lines + 1} of the anchor file {self.path} is not sealed by the "
                                "platform (a line was changed, dropped or put in)")
                raise AnchorUnavailable(self._broken)
            self._last_mac, self._lines = mac, self._lines + 1
            marks = self._index.setdefault(run_id, _RunMarks())
            last = marks.last()
            if last is None or mark.seq > last.seq:
                marks.add(mark)

    def advance(self, marks: dict[str, Mark]) -> list[str]:
        with self._lock:
            fd = self._writer()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._catch_up()
                torn = os.fstat(fd).st_size > self._offset  # a crashed writer's partial last line
                lines, added, behind, last_mac = [], [], [], self._last_mac
                for run_id, mark in sorted(marks.items()):
                    held = self._index[run_id].last() if run_id in self._index else None
                    if held is not None and mark.seq <= held.seq:
                        if mark.seq < held.seq or not held.matches(mark.hash):
                            behind.append(run_id)
                        continue
                    last_mac = seal(self._secret, last_mac, run_id, mark.seq, mark.hash)
                    lines.append(json.dumps(["v1", run_id, mark.seq, mark.hash, last_mac], separators=(",", ":")))
                    added.append((run_id, mark))
                if lines:
                    _write_all(fd, ("\n" if torn else "") + "\n".join(lines) + "\n")
                    os.fsync(fd)
                    self._offset, self._last_mac = os.fstat(fd).st_size, last_mac
                    self._lines += len(lines)
                    for run_id, mark in added:
                        self._index.setdefault(run_id, _RunMarks()).add(mark)
                return behind
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self, run_id: str) -> list[Mark]:
        with self._lock:
            try:
                self._catch_up()
            except OSError as err:
                raise AnchorUnavailable(f"the anchor file {self.path} cannot be read: {err}") from err
            found = self._index.get(run_id)
            return found.marks() if found is not None else []


def _parse(raw: bytes) -> tuple[str, Mark, str] | None:
    try:
        tag, run_id, seq, hash_, mac = json.loads(raw)
        if tag != "v1" or not isinstance(run_id, str) or not isinstance(seq, int) or not isinstance(mac, str):
            return None
        bytes.fromhex(hash_[:32])
    except (ValueError, TypeError):
        return None
    return run_id, Mark(seq, hash_), mac


def _write_all(fd: int, text: str) -> None:
    data = memoryview(text.encode())
    while data:
        data = data[os.write(fd, data):]


# -- Redis ----------------------------------------------------------------------------------------

_ADVANCE = """
local head = tonumber(redis.call('HGET', KEYS[1], 'head') or '0')
local seq = tonumber(ARGV[1])
if seq <= head then
  if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 0 end
  return -1
end
redis.call('HSET', KEYS[1], 'head', ARGV[1], ARGV[1], ARGV[2])
return 1
"""
"""Anchor one head of a run, past its last one only, and never change one: 1 added, 0 already
there, -1 the anchor is past (or forked from) the head given."""


class RedisAnchor:
    """One Redis hash per run under ``<prefix><namespace>:<run id>``: ``head`` (the last sequence
    number anchored) and, per anchored head, ``<seq>`` → ``<hash>:<mac>``. The namespace keeps
    gyms that share a Redis apart (default: derived from the internal secret, which a gym's
    replicas share)."""

    def __init__(self, url: str, secret: str, *, namespace: str, prefix: str, timeout_s: float):
        self._secret = secret.encode()
        self.namespace, self.prefix = namespace, prefix
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._advance = self._client.register_script(_ADVANCE)
        self.where = f"redis {self._client.connection_pool.connection_kwargs.get('host', '?')} {prefix}{namespace}:*"

    def key(self, run_id: str) -> str:
        return f"{self.prefix}{self.namespace}:{run_id}"

    def _mac(self, run_id: str, mark: Mark) -> str:
        return seal(self._secret, self.namespace, run_id, mark.seq, mark.hash)

    def advance(self, marks: dict[str, Mark]) -> list[str]:
        pipe = self._client.pipeline(transaction=False)
        runs = sorted(marks)
        for run_id in runs:
            mark = marks[run_id]
            self._advance(keys=[self.key(run_id)], args=[mark.seq, f"{mark.hash}:{self._mac(run_id, mark)}"],
                          client=pipe)
        return [run_id for run_id, added in zip(runs, pipe.execute(), strict=True) if int(added) < 0]

    def read(self, run_id: str) -> list[Mark]:
        try:
            fields = self._client.hgetall(self.key(run_id))
        except redis.RedisError as err:
            raise AnchorUnavailable(f"the anchor ({self.where}) cannot be reached: {type(err).__name__}") from err
        marks = []
        for field_, value in fields.items():
            name = _text(field_)
            if name == "head":
                continue
            hash_, _, mac = _text(value).partition(":")
            try:
                mark = Mark(int(name), hash_)
            except ValueError:
                mark = Mark(-1, hash_)
            if not hmac.compare_digest(mac, self._mac(run_id, mark)):
                raise AnchorUnavailable(f"the anchor's entry {name!r} for run {run_id} is not sealed by the platform")
            marks.append(mark)
        return sorted(marks, key=lambda m: m.seq)

    def release(self) -> None:
        self._client.connection_pool.disconnect()

    def close(self) -> None:
        self._client.close()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
