"""Embedded blobs in a harness: data no reviewer can read as it stands.

A harness that answers from a table can hide it from every literal check: compress it, encode
it, key it by a hash of the question. What it cannot hide is that the harness then carries a
large lump of data that is not code. This module finds such lumps in the submitted files:

* **encoded literals** — a long run of base64 / base64url / hex characters (pieces split over
  several string literals or lines count as one run) whose characters are as varied as encoded
  bytes are (Shannon entropy per character; English, code and identifiers stay well below);
* **compressed or archived data** — a file that *is* a gzip, zip, bz2, xz, zstd or zlib stream,
  a file of high byte entropy (compressed or encrypted bytes), and any encoded literal or
  ``\\xNN`` / integer-list byte literal that decodes to one of those;
* **tables of hash-like keys** — many distinct random-looking hex or base64 tokens in one file
  (a lookup table keyed by digests of the questions); lockfiles, which are made of hashes, are
  left to the two rules above.

What an ordinary harness holds — a few digests, UUIDs, a checksum, long prose prompts — stays
below every threshold. Each blob is a ``SUSPECTED`` finding of ``answer_embedding`` with its
``file:line``, its size and what it decodes to (a preview of the decoded text, so the judge and
the operator see the table itself); the harness check flags a harness that carries one, for
review (services/records/audits/harness_check.py).
"""

from __future__ import annotations

import base64
import binascii
import bz2
import gzip
import io
import lzma
import math
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from services.records.audits.findings import Finding

MIN_ENCODED_CHARS = 256
"""An encoded run shorter than this is a digest, a key or an id, not a table."""
MIN_BASE64_ENTROPY = 4.5
"""Bits per character: random base64 has ~6, English text and identifiers ~4 or less."""
MIN_HEX_ENTROPY = 3.5
"""Bits per character for a hex-only run: random hex has ~4, repeated digits far less."""
MIN_BINARY_BYTES = 1024
MIN_BINARY_ENTROPY = 7.2
"""Bits per byte over a whole file (or decoded literal): compressed or encrypted data has ~7.9."""
MIN_BYTE_LITERAL = 128
"""``\\xNN`` escapes or comma-separated small integers in a row that count as a byte literal."""
MIN_HASH_KEYS = 32
"""Distinct hash-like tokens in one file that make it a table of keys."""
MAX_DECODED_BYTES = 4 * 1024 * 1024
"""Decompression stops here (a bomb in a literal is not decompressed whole)."""
MIN_JOINED_PIECE = 40
"""A piece continues onto the next literal or line only when it is this long: encoded data is
wrapped at a fixed width (64, 76 …), lists of names and words are ragged."""
PREVIEW_CHARS = 600
"""Decoded text quoted in a finding."""
LOCKFILES = re.compile(r"(^|/)(uv\.lock|poetry\.lock|Pipfile\.lock|package-lock\.json|yarn\.lock|pnpm-lock\.yaml|"
                       r"Cargo\.lock|go\.sum|requirements[^/]*\.txt)$")

_PIECE = re.compile(r"[A-Za-z0-9+/=_\-]{16,}")
_JOIN = re.compile(r"""^(?:["'`]?\s*\\?\s*(?:\+\s*)?["'`]?|\s+)$""")
"""What may separate two pieces of one literal: quotes, whitespace, a line continuation, a ``+``."""
_HEX_ONLY = re.compile(r"^[0-9a-fA-F]+$")
_ESCAPES = re.compile(r"(?:\\x[0-9a-fA-F]{2}){" + str(MIN_BYTE_LITERAL) + ",}")
_INT_LIST = re.compile(r"(?:\b(?:25[0-5]|2[0-4]\d|1?\d?\d)\s*,\s*){" + str(MIN_BYTE_LITERAL) + ",}")
_HASH_TOKEN = re.compile(r"(?<![A-Za-z0-9+/_\-])(?:[0-9a-f]{8,64}|[0-9A-F]{8,64}|[A-Za-z0-9+/_\-]{16,64}={0,2})"
                         r"(?![A-Za-z0-9+/_\-])")

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"), (b"\x5d\x00\x00", "lzma"), (b"(\xb5/\xfd", "zstd"), (b"7z\xbc\xaf\x27\x1c", "7z"),
)


def entropy(data: str | bytes) -> float:
    """Shannon entropy in bits per symbol (character or byte)."""
    if not data:
        return 0.0
    counts = Counter(data)
    n = len(data)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


@dataclass
class Blob:
    path: str
    line: int
    kind: str
    """What it is: "base64 literal", "hex literal", "gzip file", "byte literal", "hash-key table" …"""
    size: int
    """Characters (literals) or bytes (files) it takes in the harness."""
    decoded: str = ""
    """What it decodes to, e.g. "zlib → 9,812 bytes"; empty when it decodes to nothing known."""
    preview: str = ""
    quote: str = ""
    """The start of the line it is on."""

    def evidence(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        what = f"{self.kind} of {self.size:,} {'bytes' if self.kind.endswith('file') else 'characters'}"
        text = f"embedded blob: {where}: {what}"
        if self.decoded:
            text += f", decodes to {self.decoded}"
        if self.quote:
            text += f'; line: "{self.quote}"'
        if self.preview:
            text += f"; decoded text begins: {self.preview!r}"
        return text

    def finding(self) -> Finding:
        return Finding(category="answer_embedding", code="SUSPECTED", evidence=self.evidence(), submission=True)


# ----------------------------------------------------------------------------- decoding


def _decompress(data: bytes) -> tuple[str, bytes] | None:
    """(format, decompressed bytes) when ``data`` is a compressed stream or archive, capped at
    :data:`MAX_DECODED_BYTES`; None otherwise."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name, _inflate(name, data)
    if len(data) > 2 and data[0] == 0x78 and (data[0] * 256 + data[1]) % 31 == 0:  # a zlib header
        try:
            out = zlib.decompressobj().decompress(data, MAX_DECODED_BYTES)
        except zlib.error:
            return None
        return "zlib", out
    return None


def _inflate(name: str, data: bytes) -> bytes:
    try:
        if name == "gzip":
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
                return fh.read(MAX_DECODED_BYTES)
        if name == "bz2":
            return bz2.BZ2Decompressor().decompress(data, MAX_DECODED_BYTES)
        if name in ("xz", "lzma"):
            return lzma.LZMADecompressor().decompress(data, MAX_DECODED_BYTES)
        if name == "zip":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                names = zf.namelist()
                first = zf.open(names[0]).read(MAX_DECODED_BYTES) if names else b""
                return f"[{len(names)} members: {', '.join(names[:5])}]\n".encode() + first
    except (OSError, EOFError, ValueError, lzma.LZMAError, zipfile.BadZipFile, zlib.error):
        return b""
    return b""  # zstd, 7z: recognised, not decompressed here


def _decode_text(raw: str) -> bytes | None:
    """The bytes an encoded run stands for (hex, base64 or base64url), or None."""
    text = raw.strip("=") if not _HEX_ONLY.match(raw) else raw
    if _HEX_ONLY.match(raw) and len(raw) % 2 == 0:
        try:
            return binascii.unhexlify(raw)
        except binascii.Error:
            return None
    padded = text + "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None


def _describe(data: bytes) -> tuple[str, str]:
    """What decoded bytes are: ("zlib → 9,812 bytes", preview) or ("", "") for nothing known."""
    inner = _decompress(data)
    if inner is not None:
        name, out = inner
        return f"{name} → {len(out):,} bytes", _preview(out)
    if len(data) >= MIN_BINARY_BYTES and entropy(data) >= MIN_BINARY_ENTROPY:
        return f"{len(data):,} bytes of high-entropy (compressed or encrypted) data", ""
    preview = _preview(data)
    return (f"text → {len(data):,} bytes", preview) if preview else ("", "")


def _preview(data: bytes) -> str:
    text = data[: PREVIEW_CHARS * 2].decode("utf-8", errors="replace")
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in text)
    if not text or printable < 0.9 * len(text):
        return ""
    return " ".join(text.split())[:PREVIEW_CHARS]


# ----------------------------------------------------------------------------- scanning


def _line_of(text: str, offset: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    line = text[start:] if end < 0 else text[start:end]
    line = line.strip()
    return text.count("\n", 0, offset) + 1, (line if len(line) <= 120 else line[:119] + "…")


def _encoded_runs(text: str) -> list[tuple[int, str]]:
    """(offset, characters) of each run of encoded pieces that belong together."""
    runs: list[tuple[int, str]] = []
    start, end = -1, -1
    parts: list[str] = []
    for m in _PIECE.finditer(text):
        if parts and len(parts[-1]) >= MIN_JOINED_PIECE and _JOIN.match(text[end:m.start()]) is not None:
            parts.append(m.group(0))
        else:
            if parts:
                runs.append((start, "".join(parts)))
            start, parts = m.start(), [m.group(0)]
        end = m.end()
    if parts:
        runs.append((start, "".join(parts)))
    return runs


def _scan_text(path: str, text: str) -> list[Blob]:
    found: list[Blob] = []
    for offset, run in _encoded_runs(text):
        if len(run) < MIN_ENCODED_CHARS:
            continue
        hex_only = _HEX_ONLY.match(run) is not None
        bits = entropy(run)
        decoded_bytes = _decode_text(run)
        decoded, preview = _describe(decoded_bytes) if decoded_bytes else ("", "")
        if not decoded and bits < (MIN_HEX_ENTROPY if hex_only else MIN_BASE64_ENTROPY):
            continue
        line, quote = _line_of(text, offset)
        kind = "hex literal" if hex_only else "base64 literal"
        found.append(Blob(path, line, f"{kind} (entropy {bits:.1f} bits/char)", len(run), decoded, preview, quote))
    for pattern, kind in ((_ESCAPES, "byte literal (\\x escapes)"), (_INT_LIST, "byte literal (integer list)")):
        for m in pattern.finditer(text):
            chunk = m.group(0)
            data = (bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-fA-F]{2})", chunk)) if "\\x" in chunk
                    else bytes(int(n) for n in re.findall(r"\d+", chunk)))
            decoded, preview = _describe(data)
            if decoded:
                line, quote = _line_of(text, m.start())
                found.append(Blob(path, line, kind, len(chunk), decoded, preview, quote))
    if not LOCKFILES.search(path):
        keys = {t for t in _HASH_TOKEN.findall(text) if _hash_like(t)}
        if len(keys) >= MIN_HASH_KEYS:
            first = min(text.find(k) for k in keys)
            line, quote = _line_of(text, first)
            found.append(Blob(path, line, f"table of {len(keys)} distinct hash-like keys", sum(map(len, keys)),
                              quote=quote))
    return found


def _hash_like(token: str) -> bool:
    """A digest or random key, not a word: mixes digits with letters (hex), or upper case,
    lower case and digits (base64), with varied characters."""
    body = token.rstrip("=")
    has_digit = any(c.isdigit() for c in body)
    if _HEX_ONLY.match(body):
        return has_digit and any(c.isalpha() for c in body) and _switches(body) >= 0.25
    return (has_digit and any(c.isupper() for c in body) and any(c.islower() for c in body)
            and entropy(body) >= 3.5 and _switches(body) >= 0.4)


def _switches(token: str) -> float:
    """How often neighbouring characters change class (digit, upper, lower, other): random
    keys change about every second character, names and words in long runs."""
    def cls(c: str) -> int:
        return 0 if c.isdigit() else 1 if c.isupper() else 2 if c.islower() else 3
    changes = sum(cls(a) != cls(b) for a, b in zip(token, token[1:], strict=False))
    return changes / max(1, len(token) - 1)


def scan_blobs(files: Sequence[tuple[str, bytes]]) -> list[Blob]:
    """Every blob in the harness's files (each file's bytes as uploaded)."""
    found: list[Blob] = []
    for path, data in files:
        inner = _decompress(data[:MAX_DECODED_BYTES])
        if inner is not None:
            name, out = inner
            found.append(Blob(path, 0, f"{name} file", len(data), f"{len(out):,} bytes", _preview(out)))
            continue
        if len(data) >= MIN_BINARY_BYTES and entropy(data) >= MIN_BINARY_ENTROPY:
            found.append(Blob(path, 0, "high-entropy file (compressed or encrypted data)", len(data)))
            continue
        found.extend(_scan_text(path, data.decode("utf-8", errors="replace")))
    return found


def blob_findings(files: Sequence[tuple[str, bytes]]) -> list[Finding]:
    return [b.finding() for b in scan_blobs(files)]
