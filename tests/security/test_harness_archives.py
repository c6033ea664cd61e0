"""Acceptance: agent-uploaded harness archives cannot write outside their destination, cannot
exhaust disk or memory, and a refused archive leaves nothing behind."""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.errors import Conflict, InvalidRequest, Unprocessable
from services.evaluation import archives
from services.evaluation.archives import ArchiveLimits, HarnessManifest, build_archive, extract_archive, inspect_archive

MiB = 2**20
GiB = 2**30
MANIFEST = b'[harness]\nname = "demo"\ninstall = "pip install -r requirements.txt"\nrun = "python main.py"\n'

Member = tuple[tarfile.TarInfo, bytes | None]


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, linkname, mode
    return info


def _file(name: str, data: bytes, mode: int = 0o644) -> Member:
    return _info(name, size=len(data), mode=mode), data


def _make(path: Path, members: list[Member], *, manifest: bytes | None = MANIFEST,
          fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w:gz", format=fmt) as tf:
        if manifest is not None:
            info, data = _file("harness.toml", manifest)
            tf.addfile(info, io.BytesIO(data))
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _header_only(path: Path, info: tarfile.TarInfo, fmt: int = tarfile.PAX_FORMAT) -> Path:
    """A .tar.gz whose last member claims ``info.size`` bytes but carries only 1 MiB of them: the
    header is what must be refused, so the 10 GB never need to exist anywhere."""
    manifest = tarfile.TarInfo("harness.toml")
    manifest.size = len(MANIFEST)
    with gzip.open(path, "wb") as gz:
        gz.write(manifest.tobuf(fmt))
        gz.write(MANIFEST + b"\0" * (-len(MANIFEST) % tarfile.BLOCKSIZE))
        gz.write(info.tobuf(fmt))
        gz.write(b"\0" * MiB)
    return path


def _snapshot(root: Path) -> set[tuple[str, bool]]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            found.add((full.relative_to(root).as_posix(), full.is_symlink()))
    return found


def _disk_usage(root: Path) -> int:
    return sum(Path(d, f).lstat().st_blocks * 512 for d, _, files in os.walk(root) for f in files)


class Sandbox:
    """An upload folder, a work folder holding ``dest``, and an ``outside`` folder with a
    sentinel that escaping members would aim for."""

    def __init__(self, root: Path):
        self.root = root
        self.uploads = root / "uploads"
        self.work = root / "work"
        self.outside = root / "outside"
        for d in (self.uploads, self.work, self.outside):
            d.mkdir()
        (self.outside / "sentinel").write_text("untouched")
        self.dest = self.work / "harness"

    def archive(self, members: list[Member], **kwargs: object) -> Path:
        return _make(self.uploads / "upload.tar.gz", members, **kwargs)  # type: ignore[arg-type]

    def refused(self, archive: Path, match: str, limits: ArchiveLimits | None = None) -> Unprocessable:
        before = _snapshot(self.root)
        with pytest.raises(Unprocessable, match=match):
            inspect_archive(archive, limits)
        with pytest.raises(Unprocessable, match=match) as caught:
            extract_archive(archive, self.dest, limits)
        assert not self.dest.exists() and not self.dest.is_symlink(), "a refused archive left its destination"
        assert _snapshot(self.root) == before, "a refused archive left files behind"
        assert (self.outside / "sentinel").read_text() == "untouched"
        return caught.value


@pytest.fixture
def box(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


# ----------------------------------------------------------------------------- paths and links

ESCAPES: dict[str, tuple[Callable[[], list[Member]], str]] = {
    "dotdot": (lambda: [_file("../escape", b"x")], r"member '\.\./escape' contains a '\.\.' component"),
    "nested dotdot": (lambda: [_file("src/../../escape", b"x")], r"'src/\.\./\.\./escape' contains a '\.\.'"),
    "absolute path": (lambda: [_file("/etc/x", b"x")], r"member '/etc/x' is an absolute path"),
    "escaping symlink": (lambda: [(_info("link", tarfile.SYMTYPE, linkname="../../outside"), None)],
                         r"symlink 'link' -> '\.\./\.\./outside' points outside the archive"),
    "absolute symlink": (lambda: [(_info("link", tarfile.SYMTYPE, linkname="/etc/passwd"), None)],
                         r"symlink 'link' points to an absolute path '/etc/passwd'"),
    "symlink chain": (lambda: [(_info("sub/up", tarfile.SYMTYPE, linkname=".."), None),
                               (_info("link", tarfile.SYMTYPE, linkname="sub/up/../.."), None)],
                      r"symlink 'link' -> 'sub/up/\.\./\.\.' points outside"),
    "symlink redirected later": (lambda: [(_info("link", tarfile.SYMTYPE, linkname="hop/.."), None),
                                          (_info("hop", tarfile.SYMTYPE, linkname="."), None)],
                                 r"symlink 'link' -> 'hop/\.\.' points outside"),
    "file through symlink": (lambda: [(_info("d", tarfile.SYMTYPE, linkname="sub"), None), _file("d/x", b"x")],
                             r"member 'd/x' lies under 'd', which is a symlink"),
    "symlink replaces dir": (lambda: [_file("d/x", b"x"), (_info("d", tarfile.SYMTYPE, linkname="."), None)],
                             r"member 'd' would replace a directory"),
    "hardlink outside": (lambda: [(_info("h", tarfile.LNKTYPE, linkname="../outside/sentinel"), None)],
                         r"hard link 'h' points outside the archive"),
    "hardlink absolute": (lambda: [(_info("h", tarfile.LNKTYPE, linkname="/etc/passwd"), None)],
                          r"hard link 'h' points to an absolute path '/etc/passwd'"),
    "hardlink to later member": (lambda: [(_info("h", tarfile.LNKTYPE, linkname="later"), None),
                                          _file("later", b"x")],
                                 r"hard link 'h' points to 'later', which is not an earlier member"),
    "hardlink to symlink": (lambda: [(_info("s", tarfile.SYMTYPE, linkname="harness.toml"), None),
                                     (_info("h", tarfile.LNKTYPE, linkname="s"), None)],
                            r"hard link 'h' points to 's', which is a symlink"),
    "duplicate member": (lambda: [_file("a", b"1"), _file("a", b"2")], r"member 'a' appears more than once"),
    "backslash": (lambda: [_file("..\\escape", b"x")], r"contains a backslash"),
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_escaping_members_are_refused(box: Sandbox, case: str) -> None:
    members, match = ESCAPES[case]
    box.refused(box.archive(members()), match)


@pytest.mark.parametrize(("kind", "what"), [(tarfile.CHRTYPE, "a character device"),
                                            (tarfile.BLKTYPE, "a block device"), (tarfile.FIFOTYPE, "a FIFO")])
def test_device_and_fifo_members_are_refused(box: Sandbox, kind: bytes, what: str) -> None:
    info = _info("dev/null", kind)
    info.devmajor, info.devminor = 1, 3
    box.refused(box.archive([(info, None)]), f"member 'dev/null' is {what}")


def test_paths_too_long_or_deep_are_refused(box: Sandbox) -> None:
    box.refused(box.archive([_file("/".join(["d"] * 40), b"x")]), "deeper than 32 components")
    box.refused(box.archive([_file("x" * 300, b"x")]), "component longer than 255 bytes")
    box.refused(box.archive([_file("/".join(["y" * 200] * 6), b"x")]), "longer than 1024 bytes")


# ----------------------------------------------------------------------------- sizes and bombs


def test_ten_gigabyte_member_is_refused_from_its_header(box: Sandbox) -> None:
    archive = _header_only(box.uploads / "big.tar.gz", _info("huge.bin", size=10 * GiB))
    err = box.refused(archive, r"member 'huge\.bin' is 10737418240 bytes; the limit per member is")
    assert err.status == 422 and err.param == "archive"
    assert _disk_usage(box.root) < 4 * MiB


def test_ten_gigabyte_sparse_member_is_refused(box: Sandbox) -> None:
    archive = _header_only(box.uploads / "sparse.tar.gz", _info("holes.img", tarfile.GNUTYPE_SPARSE, size=10 * GiB),
                           fmt=tarfile.GNU_FORMAT)
    box.refused(archive, r"member 'holes\.img' is a sparse file")
    assert _disk_usage(box.root) < 4 * MiB


def test_gzip_bomb_is_refused_before_its_data_is_written(box: Sandbox) -> None:
    """300 MiB of zeros in ~300 KB: the header sum passes the default 256 MiB limit."""
    archive = box.uploads / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        info, data = _file("harness.toml", MANIFEST)
        tf.addfile(info, io.BytesIO(data))
        for n in range(3):
            tf.addfile(_info(f"zeros{n}", size=100 * MiB), io.BytesIO(bytes(100 * MiB)))
    assert archive.stat().st_size < 2 * MiB
    box.refused(archive, r"member 'zeros2' takes the archive past 268435456 bytes uncompressed")
    assert _disk_usage(box.root) < 4 * MiB


def test_metadata_bomb_is_cut_off_by_counting_decompressed_bytes(box: Sandbox) -> None:
    """Every file header is small and honest, but a PAX record hides 8 MiB: only counting the
    decompressed stream catches it."""
    limits = ArchiveLimits(max_total_bytes=MiB, max_metadata_bytes=MiB)
    info, data = _file("innocent.txt", b"hi")
    info.pax_headers = {"comment": "A" * (8 * MiB)}
    archive = box.archive([(info, data)])
    assert archive.stat().st_size < 256 * 1024
    box.refused(archive, "decompresses to more than 2097152 bytes", limits)


def test_long_name_bomb_is_cut_off(box: Sandbox) -> None:
    limits = ArchiveLimits(max_total_bytes=MiB, max_metadata_bytes=MiB)
    archive = box.archive([_file("n" * (8 * MiB), b"x")], fmt=tarfile.GNU_FORMAT)
    box.refused(archive, "decompresses to more than", limits)


def test_member_and_total_limits(box: Sandbox) -> None:
    limits = ArchiveLimits(max_member_bytes=1000, max_total_bytes=1500)
    box.refused(box.archive([_file("big", bytes(1001))]), r"member 'big' is 1001 bytes", limits)
    box.refused(box.archive([_file("a", bytes(900)), _file("b", bytes(900))]), r"member 'b' takes the archive past", limits)


def test_compressed_size_limit(box: Sandbox) -> None:
    archive = box.archive([_file("noise", os.urandom(64 * 1024))])
    box.refused(archive, "compressed; the limit is 1024", ArchiveLimits(max_compressed_bytes=1024))


def test_too_many_members(box: Sandbox) -> None:
    archive = box.archive([_file(f"f{i:05}", b"") for i in range(10_000)])
    box.refused(archive, "more than 10000 members")


def test_not_a_tar_gz(box: Sandbox) -> None:
    garbage = box.uploads / "garbage.tar.gz"
    garbage.write_bytes(b"PK\x03\x04 not a tarball")
    box.refused(garbage, "not a valid .tar.gz")
    truncated = box.uploads / "truncated.tar.gz"
    truncated.write_bytes(box.archive([_file("data", os.urandom(100_000))]).read_bytes()[:40_000])
    box.refused(truncated, "not a valid .tar.gz")


# ----------------------------------------------------------------------------- the manifest


@pytest.mark.parametrize(("manifest", "match"), [
    (None, "archive has no top-level harness.toml"),
    (b"[harness\nname=", "harness.toml is not valid TOML"),
    (b'[other]\nname = "x"\n', r"harness.toml has no \[harness\] table"),
    (b'[harness]\nname = "x"\n', r"\[harness\]\.run: Field required"),
    (b'[harness]\nname = "x"\nrun = "  "\n', r"\[harness\]\.run"),
    (b'[harness]\nname = ""\nrun = "go"\n', r"\[harness\]\.name"),
    (b'[harness]\nname = "x"\nrun = "go"\nrn = "typo"\n', r"\[harness\]\.rn: Extra inputs"),
])
def test_bad_manifest_is_refused(box: Sandbox, manifest: bytes | None, match: str) -> None:
    box.refused(box.archive([_file("main.py", b"print(1)")], manifest=manifest), match)


def test_manifest_must_be_top_level_regular_file(box: Sandbox) -> None:
    nested = box.archive([_file("sub/harness.toml", MANIFEST)], manifest=None)
    box.refused(nested, "no top-level harness.toml")
    linked = box.archive([_file("real.toml", MANIFEST), (_info("harness.toml", tarfile.SYMTYPE, linkname="real.toml"), None)],
                         manifest=None)
    box.refused(linked, "harness.toml must be a regular file, not a symlink")


# ----------------------------------------------------------------------------- good archives


def test_good_archive_extracts_with_safe_modes(box: Sandbox) -> None:
    archive = box.archive([
        (_info("src", tarfile.DIRTYPE, mode=0o777), None),
        _file("src/main.py", b"print('hi')\n", mode=0o4777),
        _file("run.sh", b"#!/bin/sh\n", mode=0o2775),
        _file("data/weights.bin", os.urandom(3 * MiB)),
        (_info("latest", tarfile.SYMTYPE, linkname="src/main.py"), None),
        (_info("sub/up", tarfile.SYMTYPE, linkname=".."), None),
        (_info("copy.py", tarfile.LNKTYPE, linkname="src/main.py"), None),
    ])
    before = _snapshot(box.root)
    manifest = extract_archive(archive, box.dest)
    assert manifest == HarnessManifest(name="demo", install="pip install -r requirements.txt", run="python main.py")
    assert inspect_archive(archive) == manifest
    dest = box.dest
    assert (dest / "src/main.py").read_bytes() == b"print('hi')\n"
    assert (dest / "copy.py").read_bytes() == b"print('hi')\n"
    assert os.readlink(dest / "latest") == "src/main.py"
    assert (dest / "sub/up").resolve() == dest.resolve()
    for path in [dest, *dest.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.lstat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH | stat.S_IWGRP), f"{path} has mode {oct(mode)}"
    # the gym's alone (tests/security/test_files_at_rest.py): executables stay executable, by their owner
    assert stat.S_IMODE((dest / "src/main.py").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "data/weights.bin").stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in [dest, *dest.rglob("*")] if p.is_dir() and not p.is_symlink()} \
        == {0o700}
    new = {path for path, _ in _snapshot(box.root) - before}
    assert new and all(path == "work/harness" or path.startswith("work/harness/") for path in new), new


def test_existing_destination_is_not_touched(box: Sandbox) -> None:
    box.dest.mkdir()
    (box.dest / "keep").write_text("mine")
    with pytest.raises(Conflict, match="already exists"):
        extract_archive(box.archive([]), box.dest)
    assert (box.dest / "keep").read_text() == "mine"


def test_failure_mid_extraction_leaves_nothing(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should anything fail after files have started landing, the staging directory goes too."""
    archive = box.archive([_file(f"f{i}", b"x" * 10) for i in range(5)])
    real = archives._write_file
    calls = []

    def flaky(*args: object) -> bytes | None:
        calls.append(1)
        if len(calls) == 4:
            raise OSError("disk full")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(archives, "_write_file", flaky)
    before = _snapshot(box.root)
    with pytest.raises(OSError, match="disk full"):
        extract_archive(archive, box.dest)
    assert not box.dest.exists() and _snapshot(box.root) == before


def _harness_dir(root: Path) -> Path:
    src = root / "harness-src"
    (src / "pkg" / "empty").mkdir(parents=True)
    (src / "harness.toml").write_bytes(MANIFEST)
    (src / "pkg" / "agent.py").write_text("print('agent')\n")
    (src / "run.sh").write_text("#!/bin/sh\npython main.py\n")
    (src / "run.sh").chmod(0o775)
    (src / "main.py").write_text("import pkg\n")
    (src / "current").symlink_to("pkg/agent.py")
    return src


def test_build_archive_round_trips_deterministically(box: Sandbox) -> None:
    src = _harness_dir(box.root)
    first, second = box.uploads / "a.tar.gz", box.uploads / "b.tar.gz"
    manifest = build_archive(src, first)
    os.utime(src / "main.py", (1_000_000, 1_000_000))
    (src / "pkg" / "agent.py").chmod(0o600)
    assert build_archive(src, second) == manifest
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    assert names == ["current", "harness.toml", "main.py", "pkg", "pkg/agent.py", "pkg/empty", "run.sh"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}

    assert extract_archive(first, box.dest) == manifest
    for rel in ("harness.toml", "main.py", "pkg/agent.py", "run.sh"):
        assert (box.dest / rel).read_bytes() == (src / rel).read_bytes()
    assert os.readlink(box.dest / "current") == "pkg/agent.py"
    assert (box.dest / "pkg" / "empty").is_dir()
    assert os.access(box.dest / "run.sh", os.X_OK)


def test_build_archive_refuses_escaping_symlinks_and_bad_harnesses(box: Sandbox) -> None:
    src = _harness_dir(box.root)
    (src / "secret").symlink_to(box.outside / "sentinel")
    with pytest.raises(InvalidRequest, match=re.escape("symlink 'secret'")):
        build_archive(src, box.uploads / "out.tar.gz")
    (src / "secret").unlink()
    (src / "harness.toml").unlink()
    with pytest.raises(Unprocessable, match="no top-level harness.toml"):
        build_archive(src, box.uploads / "out.tar.gz")
    assert list(box.uploads.iterdir()) == []
