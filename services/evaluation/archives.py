"""Safe handling of agent-uploaded harness archives (``.tar.gz``).

A harness archive holds a top-level ``harness.toml``::

    [harness]
    name = "my-harness"
    install = "pip install -r requirements.txt"   # optional
    run = "python main.py"

plus any files. Archives come from agents, so they are hostile until proven otherwise:

* :func:`inspect_archive` streams the archive once, checking every header before its data is
  read (paths, link targets, member types, sizes and counts against :class:`ArchiveLimits`),
  and counts every decompressed byte so a gzip bomb is cut off however its headers lie.
* :func:`extract_archive` runs the same checks first, then streams the archive a second time
  into a fresh directory next to ``dest`` that is renamed into place only when everything
  succeeded. On any refusal nothing is left behind and nothing is ever written outside it.
* :func:`build_archive` packages a directory deterministically.

Every refusal is an :class:`~kit.errors.Unprocessable` naming the offending member.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import tomllib
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from kit.errors import Conflict, GymError, InvalidRequest, Unprocessable
from kit.private_files import DIR_MODE, EXEC_MODE, FILE_MODE, lock_down

MANIFEST_NAME = "harness.toml"
MiB = 2**20
_CHUNK = MiB
_FIXED_MTIME = 0
_NAME_MAX = 255
_MAX_LINK_HOPS = 40
_PARAM = "archive"

Kind = Literal["file", "dir", "symlink", "hardlink"]


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may hold. Sizes are bytes; depth counts path components."""

    max_compressed_bytes: int = 64 * MiB
    max_total_bytes: int = 256 * MiB
    """Sum of the sizes of all regular files."""
    max_member_bytes: int = 128 * MiB
    max_members: int = 10_000
    max_metadata_bytes: int = 32 * MiB
    """Decompressed bytes beyond file data (headers, padding, PAX records) the stream may hold."""
    max_path_length: int = 1024
    max_path_depth: int = 32
    max_manifest_bytes: int = 64 * 1024

    @property
    def max_stream_bytes(self) -> int:
        return self.max_total_bytes + self.max_metadata_bytes


_Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128,
                                         pattern=r"^[^\x00-\x1f\x7f]+$")]
_Command = Annotated[str, StringConstraints(min_length=1, max_length=16 * 1024, pattern=r"\S")]


class HarnessManifest(BaseModel):
    """The ``[harness]`` table of ``harness.toml``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: _Name
    run: _Command
    install: _Command | None = None


@dataclass(frozen=True)
class _Entry:
    """One checked member: where it goes and what it is."""

    name: str
    kind: Kind
    size: int
    linkname: str
    executable: bool


def _refuse(message: str) -> Unprocessable:
    return Unprocessable(message, param=_PARAM)


# ----------------------------------------------------------------------------- reading


class _CountingReader(io.RawIOBase):
    """Decompresses and counts; refuses once the stream passes ``cap`` bytes (a gzip bomb)."""

    def __init__(self, raw: IO[bytes], cap: int):
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._cap = cap
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        room = self._cap - self.count + 1
        size = room if size is None or size < 0 else min(size, room)
        data = self._gz.read(size)
        self.count += len(data)
        if self.count > self._cap:
            raise _refuse(f"archive decompresses to more than {self._cap} bytes; refusing it as a "
                          "decompression bomb")
        return data


@contextmanager
def _open_stream(fh: IO[bytes], limits: ArchiveLimits) -> Iterator[tarfile.TarFile]:
    """A forward-only tar stream over the decompressed, counted archive."""
    fh.seek(0)
    try:
        with tarfile.open(fileobj=_CountingReader(fh, limits.max_stream_bytes), mode="r|") as tf:
            yield tf
    except GymError:
        raise
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error, UnicodeError) as exc:
        raise _refuse(f"archive is not a valid .tar.gz: {exc}") from None


def _members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Members one at a time: the next header is read only after the caller has checked this one,
    so a refused member's data is never read."""
    while (member := tf.next()) is not None:
        yield member


@contextmanager
def _open_archive(path: Path | str, limits: ArchiveLimits) -> Iterator[IO[bytes]]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InvalidRequest(f"archive {str(path)!r} does not exist", param=_PARAM) from None
    except IsADirectoryError:
        raise InvalidRequest(f"archive {str(path)!r} is a directory", param=_PARAM) from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limits.max_compressed_bytes:
            raise _refuse(f"archive is {size} bytes compressed; the limit is {limits.max_compressed_bytes}")
        yield fh


# ----------------------------------------------------------------------------- checking


def _clean_path(raw: str, what: str, limits: ArchiveLimits) -> str:
    """A member path as normalized relative POSIX path ('' for the root), or a refusal."""
    if "\\" in raw:
        raise _refuse(f"{what} {raw!r} contains a backslash")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(f"{what} {raw!r} is not valid UTF-8") from None
    if raw.startswith("/"):
        raise _refuse(f"{what} {raw!r} is an absolute path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(f"{what} {raw!r} contains a '..' component")
    if len(encoded) > limits.max_path_length:
        raise _refuse(f"{what} {raw!r} is longer than {limits.max_path_length} bytes")
    if len(parts) > limits.max_path_depth:
        raise _refuse(f"{what} {raw!r} is deeper than {limits.max_path_depth} components")
    if any(len(p.encode("utf-8")) > _NAME_MAX for p in parts):
        raise _refuse(f"{what} {raw!r} has a component longer than {_NAME_MAX} bytes")
    return "/".join(parts)


def _link_escapes(link: str, target: str, symlinks: dict[str, str]) -> bool:
    """Whether symlink ``link -> target`` resolves outside the tree, following the archive's own
    symlinks the way the kernel would (so ``a -> ..`` then ``b -> a/..`` is caught)."""
    if target.startswith("/"):
        return True
    stack = link.split("/")[:-1]
    pending = [p for p in target.split("/") if p not in ("", ".")]
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not stack:
                return True
            stack.pop()
            continue
        stack.append(part)
        key = "/".join(stack)
        if key in symlinks:
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return True
            stack.pop()
            nested = symlinks[key]
            if nested.startswith("/"):
                return True
            pending[:0] = [p for p in nested.split("/") if p not in ("", ".")]
    return False


class _Checker:
    """The first pass: every rule that can be decided from headers alone."""

    def __init__(self, limits: ArchiveLimits):
        self.limits = limits
        self.entries: list[_Entry] = []
        self.kinds: dict[str, Kind] = {}
        self.symlinks: dict[str, str] = {}
        self.total = 0
        self.count = 0

    def check(self, member: tarfile.TarInfo) -> _Entry | None:
        """The member's entry, ``None`` for the root directory, or a refusal."""
        limits = self.limits
        self.count += 1
        if self.count > limits.max_members:
            raise _refuse(f"archive has more than {limits.max_members} members")
        name = _clean_path(member.name, "member", limits)
        label = repr(member.name)
        kind = self._kind(member, label)
        if member.size < 0 or member.size > limits.max_member_bytes:
            raise _refuse(f"member {label} is {member.size} bytes; the limit per member is {limits.max_member_bytes}")
        if kind == "file":
            self.total += member.size
            if self.total > limits.max_total_bytes:
                raise _refuse(f"member {label} takes the archive past {limits.max_total_bytes} bytes uncompressed")
        if not name:
            if kind != "dir":
                raise _refuse(f"member {label} would replace the extraction root")
            return None
        self._check_place(name, kind, label)
        linkname = ""
        if kind == "symlink":
            linkname = member.linkname
            if not linkname:
                raise _refuse(f"symlink {label} has an empty target")
            if linkname.startswith("/"):
                raise _refuse(f"symlink {label} points to an absolute path {linkname!r}")
            if len(linkname.encode("utf-8", "surrogateescape")) > limits.max_path_length:
                raise _refuse(f"symlink {label} has a target longer than {limits.max_path_length} bytes")
            if _link_escapes(name, linkname, self.symlinks):
                raise _refuse(f"symlink {label} -> {linkname!r} points outside the archive (or loops)")
            self.symlinks[name] = linkname
        elif kind == "hardlink":
            linkname = self._hardlink_target(member, label)
        entry = _Entry(name, kind, member.size if kind == "file" else 0, linkname, bool(member.mode & 0o100))
        self.entries.append(entry)
        return entry

    def finish(self) -> None:
        """Rules that need the whole archive: a symlink added later may redirect an earlier one."""
        for name, target in self.symlinks.items():
            if _link_escapes(name, target, self.symlinks):
                raise _refuse(f"symlink {name!r} -> {target!r} points outside the archive (or loops)")

    def _kind(self, member: tarfile.TarInfo, label: str) -> Kind:
        if member.issparse():
            raise _refuse(f"member {label} is a sparse file; sparse members are not allowed")
        if member.isreg():
            return "file"
        if member.isdir():
            return "dir"
        if member.issym():
            return "symlink"
        if member.islnk():
            return "hardlink"
        what = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                tarfile.FIFOTYPE: "a FIFO"}.get(member.type, f"of unsupported type {member.type!r}")
        raise _refuse(f"member {label} is {what}; only files, directories and links are allowed")

    def _check_place(self, name: str, kind: Kind, label: str) -> None:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            seen = self.kinds.setdefault(parent, "dir")
            if seen != "dir":
                raise _refuse(f"member {label} lies under {parent!r}, which is a {seen}, not a directory")
        held = self.kinds.get(name)
        if held == "dir" and kind != "dir":
            raise _refuse(f"member {label} would replace a directory of the same name")
        if held is not None and held != "dir":
            raise _refuse(f"member {label} appears more than once in the archive")
        self.kinds[name] = kind

    def _hardlink_target(self, member: tarfile.TarInfo, label: str) -> str:
        raw = member.linkname
        if raw.startswith("/"):
            raise _refuse(f"hard link {label} points to an absolute path {raw!r}")
        try:
            target = _clean_path(raw, f"hard link {label} target", self.limits)
        except Unprocessable as exc:
            raise _refuse(f"hard link {label} points outside the archive: {exc.message}") from None
        kind = self.kinds.get(target)
        if kind is None:
            raise _refuse(f"hard link {label} points to {raw!r}, which is not an earlier member of the archive")
        if kind not in ("file", "hardlink"):
            raise _refuse(f"hard link {label} points to {raw!r}, which is a {kind}, not a regular file")
        return target


def _parse_manifest(data: bytes) -> HarnessManifest:
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _refuse(f"{MANIFEST_NAME} is not valid TOML: {exc}") from None
    table = doc.get("harness")
    if not isinstance(table, dict):
        raise _refuse(f"{MANIFEST_NAME} has no [harness] table")
    try:
        return HarnessManifest.model_validate(table)
    except ValidationError as exc:
        problems = "; ".join(f"[harness].{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise _refuse(f"{MANIFEST_NAME} is invalid: {problems}") from None


def manifest_of(tree: Path | str) -> HarnessManifest:
    """The manifest of an unpacked harness directory (the built-in one, or an extracted upload);
    refused with the same messages as in an archive."""
    try:
        data = (Path(tree) / MANIFEST_NAME).read_bytes()
    except OSError as exc:
        raise _refuse(f"{MANIFEST_NAME} cannot be read: {exc.strerror}") from None
    return _parse_manifest(data)


def _read_manifest(tf: tarfile.TarFile, member: tarfile.TarInfo, limits: ArchiveLimits) -> bytes:
    if member.size > limits.max_manifest_bytes:
        raise _refuse(f"{MANIFEST_NAME} is {member.size} bytes; the limit is {limits.max_manifest_bytes}")
    fileobj = tf.extractfile(member)
    assert fileobj is not None  # a regular file
    return fileobj.read(limits.max_manifest_bytes + 1)


def expanded_bytes(entries: list[_Entry]) -> int:
    """What the checked members unpack to on disk: the sum of their regular files' sizes (hard
    links share their target's data; directories and symlinks hold no file data)."""
    return sum(e.size for e in entries if e.kind == "file")


def _scan(fh: IO[bytes], limits: ArchiveLimits) -> tuple[list[_Entry], bytes, HarnessManifest]:
    """The first pass: check every header, read only ``harness.toml``."""
    checker = _Checker(limits)
    manifest_bytes: bytes | None = None
    with _open_stream(fh, limits) as tf:
        for member in _members(tf):
            entry = checker.check(member)
            if entry is not None and entry.name == MANIFEST_NAME:
                if entry.kind != "file":
                    raise _refuse(f"{MANIFEST_NAME} must be a regular file, not a {entry.kind}")
                manifest_bytes = _read_manifest(tf, member, limits)
    checker.finish()
    if manifest_bytes is None:
        raise _refuse(f"archive has no top-level {MANIFEST_NAME}")
    return checker.entries, manifest_bytes, _parse_manifest(manifest_bytes)


def inspect_archive(path: Path | str, limits: ArchiveLimits | None = None) -> HarnessManifest:
    """Check a harness archive without extracting it; its manifest, or a refusal."""
    limits = limits or ArchiveLimits()
    with _open_archive(path, limits) as fh:
        return _scan(fh, limits)[2]


# ----------------------------------------------------------------------------- extracting


def _write_file(tf: tarfile.TarFile, member: tarfile.TarInfo, entry: _Entry, target: Path) -> bytes | None:
    """Stream one regular file out, never past its header size; the manifest's bytes are returned."""
    source = tf.extractfile(member)
    assert source is not None
    mode = EXEC_MODE if entry.executable else FILE_MODE  # the gym's alone (kit/private_files.py)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    written = 0
    keep = bytearray() if entry.name == MANIFEST_NAME else None
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > entry.size:
                raise _refuse(f"member {entry.name!r} holds more data than its header's {entry.size} bytes")
            out.write(chunk)
            if keep is not None:
                keep += chunk
    if written != entry.size:
        raise _refuse(f"member {entry.name!r} is truncated: {written} of {entry.size} bytes")
    os.chmod(target, mode)  # not the umask's doing, not the archive's: never setuid, nobody else's to read
    return bytes(keep) if keep is not None else None


def _unpack(fh: IO[bytes], entries: list[_Entry], manifest_bytes: bytes, root: Path, limits: ArchiveLimits) -> None:
    """The second pass: the archive must match what the first pass checked, member for member.

    Symlinks are created last, so no file is ever written through one."""
    plan = iter(entries)
    symlinks: list[_Entry] = []
    checker = _Checker(limits)  # the same rules again: the file may have changed between passes
    with _open_stream(fh, limits) as tf:
        for member in _members(tf):
            entry = checker.check(member)
            if entry is None:
                continue
            if entry != next(plan, None):
                raise _refuse(f"archive changed while being extracted (at member {member.name!r})")
            try:
                tarfile.data_filter(member, str(root))  # defence in depth; ours is stricter
            except tarfile.FilterError as exc:
                raise _refuse(f"member {member.name!r} refused: {exc}") from None
            target = root / entry.name
            if entry.kind == "dir":
                target.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            if entry.kind == "file":
                data = _write_file(tf, member, entry, target)
                if data is not None and data != manifest_bytes:
                    raise _refuse(f"archive changed while being extracted (at member {member.name!r})")
            elif entry.kind == "hardlink":
                os.link(root / entry.linkname, target, follow_symlinks=False)
            else:
                symlinks.append(entry)
    if next(plan, None) is not None:
        raise _refuse("archive changed while being extracted (members missing)")
    for entry in symlinks:
        os.symlink(entry.linkname, root / entry.name)


def extract_archive(path: Path | str, dest_dir: Path | str, limits: ArchiveLimits | None = None,
                    admit: Callable[[int], None] | None = None) -> HarnessManifest:
    """Check, then extract a harness archive into ``dest_dir`` (which must not exist yet).

    ``admit`` is called with the archive's expanded size (:func:`expanded_bytes`) once every
    header has been checked and before anything is written: it raises to refuse (a storage
    quota), and the second pass never writes more than the headers it admitted.

    Extraction goes into a fresh directory beside ``dest_dir`` that is renamed into place only
    when every member is out; on any refusal it is removed and ``dest_dir`` never appears."""
    limits = limits or ArchiveLimits()
    dest = Path(dest_dir)
    if dest.exists() or dest.is_symlink():
        raise Conflict(f"extraction destination {str(dest)!r} already exists", param="dest")
    if not dest.parent.is_dir():
        raise InvalidRequest(f"parent of extraction destination {str(dest)!r} is not a directory", param="dest")
    with _open_archive(path, limits) as fh:
        entries, manifest_bytes, manifest = _scan(fh, limits)
        if admit is not None:
            admit(expanded_bytes(entries))
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
        try:
            _unpack(fh, entries, manifest_bytes, staging, limits)
            lock_down(staging)  # directories made as parents got the umask's mode: 0700, all of them
            if dest.exists() or dest.is_symlink():
                raise Conflict(f"extraction destination {str(dest)!r} already exists", param="dest")
            staging.rename(dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest


# ----------------------------------------------------------------------------- building


def _tarinfo(root: Path, path: Path) -> tarfile.TarInfo | None:
    """A normalized header for one path under ``root``; ``None`` to skip the root itself."""
    rel = path.relative_to(root).as_posix()
    if rel == ".":
        return None
    info = tarfile.TarInfo(rel)
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        real_root = os.path.realpath(root)
        if posixpath.isabs(target) or os.path.commonpath([real_root, resolved]) != real_root:
            raise InvalidRequest(f"symlink {rel!r} -> {target!r} points outside {str(root)!r}", param="src_dir")
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif stat.S_ISREG(st.st_mode):
        info.size, info.mode = st.st_size, 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    else:
        raise InvalidRequest(f"{rel!r} is not a file, directory or symlink", param="src_dir")
    info.mtime, info.uid, info.gid, info.uname, info.gname = _FIXED_MTIME, 0, 0, "", ""
    return info


def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root`` in sorted order, not descending into symlinked directories."""
    yield root
    for child in sorted(root.iterdir(), key=lambda p: p.name):
        if child.is_dir() and not child.is_symlink():
            yield from _walk(child)
        else:
            yield child


def build_archive(src_dir: Path | str, out_path: Path | str, limits: ArchiveLimits | None = None) -> HarnessManifest:
    """Package ``src_dir`` as a deterministic ``.tar.gz`` (sorted members, fixed mtime, owner 0)
    and check the result as an upload would be checked; returns its manifest."""
    root, out = Path(src_dir), Path(out_path)
    if not root.is_dir():
        raise InvalidRequest(f"{str(root)!r} is not a directory", param="src_dir")
    infos = [(p, info) for p in _walk(root) if (info := _tarinfo(root, p)) is not None]
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.partial-", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_FIXED_MTIME) as gz, \
                tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tf:
            for path, info in infos:
                if info.isreg():
                    with open(path, "rb") as fh:
                        tf.addfile(info, fh)
                else:
                    tf.addfile(info)
        manifest = inspect_archive(tmp, limits)
        tmp.chmod(0o644)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return manifest
