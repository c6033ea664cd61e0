"""Issue 13, items 1 and 2: no request can bloat the gateway or stall its event loop.

An embedded gym runs in its own process, served by uvicorn with the options ``rsigym up`` uses;
the tests play the abusive client over raw sockets and read the gateway's memory from /proc:
huge bodies (declared and streamed, with and without a key, to a JSON route and to an upload
route) are refused while they stream in, a trickled body is cut, JSON shapes that are expensive
to parse are refused before parsing, and /healthz keeps answering while an attacker loops
5-million-``{}`` bodies. Nothing is charged and nothing stays reserved for any of it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.gym_process import Answer, GymProcess, gym_process, push, read_answer, repeat

MiB = 1024 * 1024
UPLOAD_LIMIT = 16 * MiB
BODY_TIMEOUT_S = 3
CONFIG = f"""
[http]
max_upload_body_bytes = {UPLOAD_LIMIT}
body_timeout_s = {BODY_TIMEOUT_S}
"""
JSON_LIMIT = 8 * MiB  # the default
HUGE = 200 * MiB
CHAT = "/rollout/v1/chat/completions"
DATASETS = "/training/v1/datasets"
BOMB = b"[" + b",".join([b"{}"] * 5_000_000) + b"]"
"""14 MiB of five million empty objects (what froze /healthz for ~8 s)."""


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymProcess]:
    with gym_process(tmp_path_factory.mktemp("bounded") / "data", CONFIG) as served:
        yield served


@pytest.fixture(scope="module")
def key(gym: GymProcess) -> str:
    return gym.key()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def _assert_error(answer: Answer, status: int, kind: str) -> None:
    assert answer.status == status, answer
    assert answer.body is not None and answer.body["type"] == "error", answer
    assert answer.body["error"]["type"] == kind, answer.body
    assert answer.body["request_id"], answer.body


def _growth(gym: GymProcess, send: Any) -> tuple[Answer, int]:
    """The answer to ``send()`` and how far the gateway's peak RSS rose above its RSS before it."""
    time.sleep(0.2)
    gym.reset_peak()
    before = gym.rss_bytes()
    answer = send()
    time.sleep(0.2)
    return answer, gym.peak_rss_bytes() - before


def test_unauthenticated_huge_bodies_are_refused_unread(gym: GymProcess) -> None:
    for path in (CHAT, DATASETS, "/v1/keys"):  # proxied JSON, proxied upload, a gateway route with a body model
        declared, grew = _growth(gym, lambda p=path: push(gym.port, "POST", p, {"Content-Length": str(HUGE)},
                                                          repeat(b"x" * MiB, HUGE), chunked=False))
        _assert_error(declared, 401, "authentication_error")
        assert declared.sent < 32 * MiB, f"the gateway read {declared.sent} bytes of a keyless body to {path}"
        assert grew < 32 * MiB, f"a keyless {HUGE}-byte body to {path} grew the gateway by {grew} bytes"
        streamed, grew = _growth(gym, lambda p=path: push(gym.port, "POST", p, {}, repeat(b"x" * MiB, HUGE),
                                                          chunked=True))
        _assert_error(streamed, 401, "authentication_error")
        assert grew < 32 * MiB, f"a keyless chunked body to {path} grew the gateway by {grew} bytes"


def test_admin_api_reads_no_body_without_the_admin_token(gym: GymProcess, key: str) -> None:
    answer = push(gym.port, "POST", "/admin/v1/keys", {**_auth(key), "Content-Length": str(4 * MiB)},
                  repeat(b"[" * 65536, 4 * MiB), chunked=False)
    _assert_error(answer, 401, "authentication_error")  # a run key is no admin token
    assert answer.sent < 4 * MiB


def test_huge_json_body_with_a_key_is_cut_while_it_streams(gym: GymProcess, key: str) -> None:
    declared = push(gym.port, "POST", CHAT, {**_auth(key), "Content-Length": str(HUGE)}, repeat(b" " * MiB, HUGE),
                    chunked=False)
    _assert_error(declared, 413, "payload_too_large")
    assert declared.sent < 32 * MiB  # answered on the declared length, before the body
    streamed, grew = _growth(gym, lambda: push(gym.port, "POST", CHAT, _auth(key), repeat(b" " * MiB, HUGE),
                                               chunked=True))
    _assert_error(streamed, 413, "payload_too_large")
    assert streamed.sent < JSON_LIMIT + 32 * MiB, streamed.sent
    assert grew < 48 * MiB, f"a chunked {HUGE}-byte JSON body grew the gateway by {grew} bytes"


def test_huge_upload_with_a_key_is_cut_at_the_upload_limit(gym: GymProcess, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/octet-stream"}
    declared = push(gym.port, "POST", DATASETS, {**headers, "Content-Length": str(HUGE)}, repeat(b"x" * MiB, HUGE),
                    chunked=False)
    _assert_error(declared, 413, "payload_too_large")
    streamed, grew = _growth(gym, lambda: push(gym.port, "POST", DATASETS, headers, repeat(b"x" * MiB, HUGE),
                                               chunked=True))
    _assert_error(streamed, 413, "payload_too_large")
    assert streamed.sent < UPLOAD_LIMIT + 32 * MiB, streamed.sent
    assert grew < 3 * UPLOAD_LIMIT + 16 * MiB, f"a chunked {HUGE}-byte upload grew the gateway by {grew} bytes"


def test_a_trickled_body_is_cut_with_408(gym: GymProcess, key: str) -> None:
    started = time.monotonic()
    answer = push(gym.port, "POST", CHAT, {**_auth(key), "Content-Length": "100"}, repeat(b" ", 100),
                  chunked=False, pause_s=0.2, answer_timeout=BODY_TIMEOUT_S + 30, close_wait_s=2)
    _assert_error(answer, 408, "request_timeout")
    assert answer.sent < 100, "the slow client got to send its whole body"
    # Closed with the answer, not at the keep-alive timeout (5 s): the trickled bytes are never read.
    assert answer.closed, "the connection stayed open after the 408"
    assert time.monotonic() - started < BODY_TIMEOUT_S + 20


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_refused_before_policy(gym: GymProcess, key: str, depth: int) -> None:
    body = b'{"model":"tiny","messages":' + b"[" * depth + b"]" * depth + b"}"
    r = httpx.post(gym.url + CHAT, content=body, headers=_auth(key), timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "payload_too_large"
    assert "nested" in r.json()["error"]["message"]


def test_json_with_too_many_elements_is_refused_before_parsing(gym: GymProcess, key: str) -> None:
    body = b'{"model":"tiny","messages":[' + b",".join([b"{}"] * 600_000) + b"]}"  # 1.8 MB: under the size limit
    assert len(body) < JSON_LIMIT
    for content_type in ("application/json", "text/plain"):  # the proxy parses JSON whatever it is labelled
        r = httpx.post(gym.url + CHAT, content=body, headers={**_auth(key), "Content-Type": content_type},
                       timeout=60)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["type"] == "payload_too_large"


def test_json_with_too_many_values_is_refused_before_policy(gym: GymProcess, key: str) -> None:
    """Few tokens per value (so under ``max_json_tokens``), but more values than a service should
    validate on its event loop for one call."""
    message = b'{"role":"user","content":"a"}'
    body = b'{"model":"tiny","messages":[' + b",".join([message] * 30_000) + b"]}"
    r = httpx.post(gym.url + CHAT, content=body, headers=_auth(key), timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "payload_too_large"
    assert "elements" in r.json()["error"]["message"]


def test_healthz_answers_while_an_attacker_loops_element_bombs(gym: GymProcess, key: str) -> None:
    stop = threading.Event()
    attacks: list[int | None] = []

    def attack() -> None:
        while not stop.is_set():
            declared = push(gym.port, "POST", CHAT, {**_auth(key), "Content-Length": str(len(BOMB))},
                            iter([BOMB]), chunked=False)
            streamed = push(gym.port, "POST", CHAT, _auth(key), repeat(BOMB, len(BOMB)), chunked=True)
            attacks.extend([declared.status, streamed.status])

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    worst = 0.0
    probes = 0
    try:
        with httpx.Client(base_url=gym.url, timeout=10) as client:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                r = client.get("/healthz")
                worst = max(worst, time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                probes += 1
                time.sleep(0.05)
    finally:
        stop.set()
        attacker.join(timeout=60)
    assert worst < 1.0, f"/healthz took {worst:.2f} s while bodies of five million {{}} were sent ({probes} probes)"
    assert attacks and set(attacks) == {413}, attacks


def _send_head(port: int, pieces: Iterator[bytes]) -> Answer:
    """Send a request head piece by piece until the server answers or closes; the answer (its
    ``sent``: how many bytes of the head the server took)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        return _push_head(sock, pieces)
    finally:
        sock.close()


def _push_head(sock: socket.socket, pieces: Iterator[bytes]) -> Answer:
    """:func:`_send_head` on a connection already open."""
    sent = 0
    for piece in pieces:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(piece)
        except OSError:
            break
        sent += len(piece)
    status, body, closed = read_answer(sock, 30, 5)
    return Answer(status, body, sent, closed)


def test_an_oversized_request_head_is_refused_with_431_while_it_streams(gym: GymProcess, key: str) -> None:
    """A header that never ends (and one 64 KiB header sent at once) is refused at
    ``[http] max_header_bytes`` (16 KiB by default) in the standard error shape, and the connection
    closed: the server held at most the limit and one read of it."""
    head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nX-Pad: ".encode()
    endless = itertools.chain([head], itertools.repeat(b"a" * 4096, 64 * MiB // 4096))
    answer = _send_head(gym.port, endless)
    _assert_error(answer, 431, "request_header_too_large")
    assert answer.closed, "the connection stayed open after the 431"
    assert answer.sent < 8 * MiB, f"the server read {answer.sent} bytes of one request head"

    whole = head + b"a" * (64 * 1024) + b"\r\n\r\n"
    answer = _send_head(gym.port, iter([whole]))
    _assert_error(answer, 431, "request_header_too_large")

    under = head + b"a" * (8 * 1024) + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    answer = _send_head(gym.port, iter([under]))
    _assert_error(answer, 422, "invalid_request_error")  # under the limit: read, routed, the body refused


def test_the_next_request_on_a_kept_alive_connection_is_bounded_too(gym: GymProcess, key: str) -> None:
    """A first request answered on a connection kept alive, then a head that never ends on the same
    connection: refused at the limit like the first head of a connection."""
    sock = socket.create_connection(("127.0.0.1", gym.port), timeout=30)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, body, closed = read_answer(sock, 30, 0)
        assert (status, closed) == (200, False) and body is not None and body["status"] == "ok", (status, body)
        head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ".encode()
        answer = _push_head(sock, itertools.chain([head], itertools.repeat(b"a" * 4096, 64 * MiB // 4096)))
        _assert_error(answer, 431, "request_header_too_large")
        assert answer.closed and answer.sent < 8 * MiB, answer
    finally:
        sock.close()


def test_an_oversized_head_pipelined_behind_a_request_is_refused_and_never_answers_for_it(gym: GymProcess) -> None:
    """A small request and a 64 KiB head in one read: the oversized head is measured when it is
    parsed, the connection is closed, and whatever comes back for the first request is its own."""
    sock = socket.create_connection(("127.0.0.1", gym.port), timeout=30)
    try:
        first = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        sock.sendall(first + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * (64 * 1024) + b"\r\n\r\n")
        status, body, _closed = read_answer(sock, 30, 0)
        assert status in (None, 200), (status, body)
        rest = b""
        sock.settimeout(10)
        with contextlib.suppress(ConnectionError, TimeoutError):
            while chunk := sock.recv(65536):
                rest += chunk
        assert b"HTTP/1.1 200" not in rest, "the oversized head was taken and answered"
    finally:
        sock.close()


def test_a_small_head_and_a_large_body_in_one_read_are_not_taken_for_a_large_head(gym: GymProcess, key: str) -> None:
    """Only the head counts: 60 KiB of JSON sent with its 200-byte head in one piece is read and
    routed (the policy refuses its unknown model; the head limit is 16 KiB)."""
    body = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x" * 60_000}]}).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    answer = _send_head(gym.port, iter([head + body]))
    assert answer.status not in (None, 431), answer
    assert answer.body is not None and answer.body["error"]["type"] != "request_header_too_large", answer


def test_a_malformed_request_line_gets_the_standard_400(gym: GymProcess) -> None:
    answer = _send_head(gym.port, iter([b"GET /healthz HTTP/1.1 extra\r\nHost: x\r\n\r\n"]))
    _assert_error(answer, 400, "invalid_request_error")
    assert answer.closed
    # a broken header line is refused the same way, and its bytes are not echoed back
    answer = _send_head(gym.port, iter([b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Token sk-leak-3141\r\n\r\n"]))
    _assert_error(answer, 400, "invalid_request_error")
    assert "sk-leak" not in json.dumps(answer.body)


def test_refused_calls_charge_nothing_and_hold_nothing(gym: GymProcess, key: str) -> None:
    """Runs last in this module: every call above was refused on this key."""
    r = httpx.get(gym.url + "/v1/balance", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    balance = r.json()
    assert balance["spent_usd"] == 0 and balance["reserved_usd"] == 0, balance


def test_refusals_are_counted_in_metrics(gym: GymProcess) -> None:
    from tests.fakes.gym_process import ADMIN_TOKEN

    text = httpx.get(gym.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30).text
    lines = [line for line in text.splitlines() if "payload_too_large" in line and not line.startswith("#")]
    assert lines and any(float(line.rsplit(" ", 1)[1]) > 0 for line in lines), lines


def test_defaults_are_documented() -> None:
    from kit.config import HttpConfig

    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    bounds = doc.split("## Resource bounds", 1)[1].split("\n## ", 1)[0]
    for name in HttpConfig.model_fields:
        assert name in bounds, f"docs/security.md's resource bounds do not list [http] {name}"
