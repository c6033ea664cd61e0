"""The agent CLI ``gym``: output, exit codes, and the requests it makes."""

from __future__ import annotations

import io
import json

import pytest

from rsigym import cli

CHAT = ["rollout", "chat", "--model", "teacher"]


@pytest.fixture
def run(gateway, capsys):
    """Run ``gym ARGS`` against the fake gateway; returns (exit code, stdout, stderr)."""

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv), client_factory=gateway.gym)
        out, err = capsys.readouterr()
        return code, out, err

    return _run


def test_balance_plain_and_json(gateway, run, canned):
    gateway.route("GET", "/v1/balance", gateway.ok(canned["balance"]))
    code, out, err = run("balance")
    assert (code, err) == (0, "")
    assert out == "remaining $3.21 of $5.00 (spent $1.70, reserved $0.09)\n"
    code, out, _ = run("balance", "--json")
    assert code == 0 and json.loads(out) == canned["balance"]


def test_rollout_models(gateway, run, canned):
    gateway.route("GET", "/rollout/v1/models", gateway.ok(canned["models"]))
    code, out, _ = run("rollout", "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["teacher", "input_usd_per_mtok=1.0", "output_usd_per_mtok=2.0"]
    assert lines[1] == "tiny-local"
    code, out, _ = run("rollout", "models", "--json")
    assert [m["id"] for m in json.loads(out)] == ["teacher", "tiny-local"]


def test_chat_plain_prints_reply_then_cost_on_stderr(gateway, run, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.ok(canned["completion"], request_id="req_c", cost="0.000123", remaining="4.87"),
    )
    code, out, err = run(*CHAT, "--system", "be brief", "--max-tokens", "20", "--temperature", "0.2", "Say hi")
    assert code == 0
    assert out == "Hello there.\n"
    assert err == "[cost $0.000123 | remaining $4.87 | request_id req_c]\n"
    assert gateway.json_sent() == {
        "model": "teacher",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hi"}],
        "max_tokens": 20,
        "temperature": 0.2,
    }


def test_chat_json_carries_the_metadata(gateway, run, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.ok(canned["completion"], request_id="req_c", cost="0.5", remaining="1"),
    )
    code, out, err = run(*CHAT, "--json", "hi")
    data = json.loads(out)
    assert (code, err) == (0, "")
    assert data["choices"][0]["message"]["content"] == "Hello there."
    assert data["rsigym"] == {"request_id": "req_c", "cost_usd": 0.5, "remaining_usd": 1.0}
    assert gateway.json_sent()["messages"] == [{"role": "user", "content": "hi"}]


def test_chat_prompt_dash_reads_stdin(gateway, run, canned, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("from a pipe"))
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.ok(canned["completion"]))
    assert run(*CHAT, "-")[0] == 0
    assert gateway.json_sent()["messages"] == [{"role": "user", "content": "from a pipe"}]


def _stream_body(canned, usage_cost: float | None = 0.0015):
    chunk, event = canned["chunk"], canned["sse_event"]
    body = [event(chunk(role="assistant")), event(chunk("Hel")), event(chunk("lo"))]
    if usage_cost is not None:
        usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4, "cost_usd": usage_cost}
        body.append(event(chunk(usage=usage)))
    return [*body, b"data: [DONE]\n\n"]


def test_chat_stream_plain_reports_the_exact_cost(gateway, run, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.sse(_stream_body(canned), request_id="req_s", cost="0.002", remaining="3"),
    )
    code, out, err = run(*CHAT, "--stream", "hi")
    assert code == 0
    assert out == "Hello\n"
    assert err == "[cost $0.0015 | remaining $3.00 | request_id req_s]\n"
    sent = gateway.json_sent()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_chat_stream_without_usage_says_the_cost_is_a_reservation(gateway, run, canned):
    gateway.route(
        "POST", "/rollout/v1/chat/completions", gateway.sse(_stream_body(canned, None), cost="0.002", remaining="3")
    )
    code, out, err = run(*CHAT, "--stream", "hi")
    assert (code, out) == (0, "Hello\n")
    assert err.startswith("[cost <= $0.002 (reserved) | remaining $3.00")


def test_chat_stream_json_is_one_object_per_line(gateway, run, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.sse(_stream_body(canned), request_id="req_s", cost="0.002", remaining="3"),
    )
    code, out, _ = run(*CHAT, "--stream", "--json", "hi")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 5
    assert [line["object"] for line in lines[:4]] == ["chat.completion.chunk"] * 4
    assert lines[3]["usage"]["cost_usd"] == 0.0015
    assert lines[-1] == {"rsigym": {"request_id": "req_s", "cost_usd": 0.0015, "remaining_usd": 3.0}}


def test_keys_mint_with_policy_file(gateway, run, tmp_path):
    policy = {"services": ["inference"], "models": ["tiny-local"]}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    gateway.route(
        "POST",
        "/v1/keys",
        gateway.ok(
            {
                "id": "ck_1",
                "key": "rsg_child",
                "name": "harness",
                "status": "active",
                "budget_usd": 0.25,
                "policy": policy,
            }
        ),
    )
    code, out, err = run("keys", "mint", "--name", "harness", "--budget", "0.25", "--policy-file", str(path))
    assert code == 0
    assert gateway.json_sent() == {"name": "harness", "budget_usd": 0.25, "policy": policy}
    assert "rsg_child" in out and "ck_1" in out and "$0.25" in out
    assert "shown only once" in err
    code, out, _ = run("keys", "mint", "--json")
    assert json.loads(out)["key"] == "rsg_child"


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_bad_policy_file_is_a_usage_error(gateway, run, tmp_path, content):
    path = tmp_path / "policy.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run("keys", "mint", "--policy-file", str(path))
    assert (code, out) == (2, "")
    assert "--policy-file" in err
    assert gateway.requests == []


def test_keys_list_and_revoke(gateway, run):
    gateway.route(
        "GET",
        "/v1/keys",
        gateway.ok(
            {
                "data": [
                    {"id": "ck_1", "name": "harness", "status": "active", "budget_usd": 1.0, "spent_usd": 0.125},
                    {"id": "ck_22", "status": "revoked"},
                ]
            }
        ),
    )
    gateway.route("POST", "/v1/keys/ck_1/revoke", gateway.ok({"id": "ck_1", "status": "revoked"}))
    code, out, _ = run("keys", "list")
    rows = [line.split() for line in out.splitlines()]
    assert code == 0
    assert rows == [
        ["ID", "NAME", "STATUS", "BUDGET", "SPENT"],
        ["ck_1", "harness", "active", "$1.00", "$0.125"],
        ["ck_22", "-", "revoked", "-", "-"],
    ]
    assert [k["id"] for k in json.loads(run("keys", "list", "--json")[1])] == ["ck_1", "ck_22"]
    assert run("keys", "revoke", "ck_1") == (0, "ck_1: revoked\n", "")


def test_keys_list_empty(gateway, run):
    gateway.route("GET", "/v1/keys", gateway.ok({"data": []}))
    assert run("keys", "list") == (0, "no child keys\n", "")


def test_api_error_goes_to_stderr_with_exit_1(gateway, run):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.error(402, "budget_exhausted", "Budget exhausted", request_id="req_402"),
    )
    code, out, err = run(*CHAT, "hi")
    assert (code, out) == (1, "")
    assert err == "error: budget_exhausted: Budget exhausted (request_id req_402)\n"


def test_connection_error_exit_1(gateway, run):
    import httpx

    gateway.route("GET", "/v1/balance", httpx.ConnectError("refused"))
    code, out, err = run("balance")
    assert (code, out) == (1, "")
    assert err.startswith("error: connection_error: ")


def test_missing_key_is_reported_not_a_traceback(capsys):
    code = cli.main(["balance"])  # the real factory: Gym() with no RSIGYM_API_KEY
    _, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("error: configuration_error: ") and "RSIGYM_API_KEY" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["rollout"],
        ["rollout", "chat", "hi"],  # no --model
        ["rollout", "chat", "--model", "m", "--max-tokens", "many", "hi"],
        ["keys", "revoke"],
        ["nope"],
    ],
)
def test_usage_errors_exit_2_without_calling_the_gateway(gateway, run, argv):
    code, out, err = run(*argv)
    assert (code, out) == (2, "")
    assert "usage: gym" in err
    assert gateway.requests == []


def test_help_exits_0(run):
    code, out, _ = run("--help")
    assert code == 0 and "rollout" in out and "keys" in out


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (5, "$5.00"),
        (1.7, "$1.70"),
        (0.000123, "$0.000123"),
        (0, "$0.00"),
        (1234.5, "$1234.50"),
        (-0.5, "-$0.50"),
        (None, "-"),
    ],
)
def test_format_usd(value, text):
    assert cli.format_usd(value) == text
