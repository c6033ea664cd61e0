"""Embedded blobs in a harness (issue 51, item 3): every common way to carry a compressed or
encoded table is found and decoded; ordinary code, a few digests and UUIDs, the shipped
harness and this repository's own code are not. (tests/security/test_answer_tables.py plays
the attack end to end.)"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import uuid
import zlib
from pathlib import Path

import pytest

from services.records.audits.blobs import scan_blobs
from services.records.audits.score_gap import noise_bound

ROOT = Path(__file__).resolve().parents[4]
TABLE = {hashlib.sha256(f"salt{i}".encode()).hexdigest()[:10]: str(i * 7) for i in range(60)}
PACKED = zlib.compress(json.dumps(TABLE).encode())
B64 = base64.b64encode(PACKED).decode()

HIDDEN = {
    "base64 on one line": f'TABLE = "{B64}"\n',
    "base64 wrapped in a docstring": 'TABLE = """\n' + "\n".join(B64[i:i + 76] for i in range(0, len(B64), 76)) + '\n"""\n',
    "base64 split over literals": "TABLE = (\n" + "\n".join(f'    "{B64[i:i + 60]}"' for i in range(0, len(B64), 60)) + "\n)\n",
    "hex of gzip": f'TABLE = bytes.fromhex("{gzip.compress(json.dumps(TABLE).encode()).hex()}")\n',
    "\\x escapes": "TABLE = b'" + "".join(f"\\x{b:02x}" for b in PACKED) + "'\n",
    "integer list": "TABLE = bytes([" + ", ".join(str(b) for b in PACKED) + "])\n",
    "base64 of plain JSON": f'TABLE = "{base64.b64encode(json.dumps(TABLE).encode()).decode()}"\n',
    "table of hash keys": "TABLE = {\n" + "".join(f'    "{k[:8]}": "{v}",\n' for k, v in TABLE.items()) + "}\n",
}


@pytest.mark.parametrize("how", sorted(HIDDEN))
def test_a_table_hidden_in_a_literal_is_found(how: str) -> None:
    found = scan_blobs([("agent.py", HIDDEN[how].encode())])
    assert len(found) == 1, found
    finding = found[0].finding()
    assert finding.code == "SUSPECTED" and finding.category == "answer_embedding" and finding.submission
    assert finding.evidence.startswith("embedded blob: agent.py:")
    if how != "table of hash keys":  # decoded: the judge and the operator read the table itself
        assert '"' + next(iter(TABLE)) + '"' in finding.evidence


def test_a_compressed_file_and_a_high_entropy_file_are_found() -> None:
    found = scan_blobs([("answers.dat", PACKED), ("weights.bin", bytes(range(256)) * 8)])
    assert [b.kind for b in found] == ["zlib file", "high-entropy file (compressed or encrypted data)"]
    assert next(iter(TABLE)) in found[0].evidence()


def test_ordinary_code_with_a_few_digests_and_uuids_is_not_a_blob() -> None:
    ordinary = (f'CHECKSUM = "{hashlib.sha256(b"x").hexdigest()}"\nRUN = "{uuid.uuid4()}"\n'
                f'COMMIT = "{hashlib.sha1(b"y").hexdigest()}"\n'
                'PROMPT = """' + "Think step by step and write only the final answer. " * 200 + '"""\n')
    assert scan_blobs([("agent.py", ordinary.encode())]) == []
    shipped = [(p.name, p.read_bytes()) for p in (ROOT / "agent_container" / "harness").rglob("*") if p.is_file()]
    assert shipped and scan_blobs(shipped) == []
    own = [(str(p), p.read_bytes()) for p in (ROOT / "services").rglob("*.py")]
    assert scan_blobs(own) == [], "the gym's own code is ordinary code"


def test_the_score_gap_noise_bound() -> None:
    assert noise_bound(60, 60, 0.99) == pytest.approx(math.sqrt(math.log(100) / 60))
    assert noise_bound(5, 5, 0.99) < 1.0 < noise_bound(4, 4, 0.99)  # 1.0 vs 0.0 on 5 tasks each is beyond noise
