"""Gym / AsyncGym: configuration, request shapes, parsed results and their metadata."""

from __future__ import annotations

import httpx
import pytest

import rsigym
from rsigym._config import DEFAULT_BASE_URL, resolve_config

HI = [{"role": "user", "content": "hi"}]


# ---- configuration --------------------------------------------------------------------


def test_env_gives_url_and_key(monkeypatch, gateway, canned):
    monkeypatch.setenv("RSIGYM_URL", "http://gateway.from.env:9000/")
    monkeypatch.setenv("RSIGYM_API_KEY", "rsg_from_env")
    gateway.route("GET", "/v1/balance", gateway.ok(canned["balance"]))
    with rsigym.Gym(http_client=httpx.Client(transport=httpx.MockTransport(gateway))) as gym:
        assert gym.base_url == "http://gateway.from.env:9000"
        gym.balance()
    request = gateway.requests[0]
    assert str(request.url) == "http://gateway.from.env:9000/v1/balance"
    assert request.headers["Authorization"] == "Bearer rsg_from_env"


def test_arguments_win_over_env(monkeypatch):
    monkeypatch.setenv("RSIGYM_URL", "http://env")
    monkeypatch.setenv("RSIGYM_API_KEY", "env-key")
    config = resolve_config("http://arg", "arg-key")
    assert (config.base_url, config.api_key) == ("http://arg", "arg-key")


def test_default_url_when_unset():
    assert resolve_config(api_key="k").base_url == DEFAULT_BASE_URL == "http://127.0.0.1:8700"
    assert rsigym.Gym(api_key="k").base_url == "http://127.0.0.1:8700"


def test_missing_key_fails_at_construction_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("RSIGYM_API_KEY", "   ")
    for cls in (rsigym.Gym, rsigym.AsyncGym):
        with pytest.raises(rsigym.ConfigurationError, match="RSIGYM_API_KEY") as info:
            cls()
        assert isinstance(info.value, rsigym.RSIGymError)


def test_key_never_appears_in_repr():
    gym = rsigym.Gym(base_url="http://x", api_key="rsg_secret")
    assert "rsg_secret" not in repr(gym)
    assert "rsg_secret" not in repr(resolve_config(api_key="rsg_secret"))


def test_path_prefix_in_base_url_is_kept(gateway, canned):
    gateway.route("GET", "/gym/v1/balance", gateway.ok(canned["balance"]))
    with gateway.gym(base_url="http://proxy.test/gym/") as gym:
        gym.balance()
    assert gateway.requests[0].url.path == "/gym/v1/balance"


# ---- resources --------------------------------------------------------------------------


def test_balance_and_its_metadata(gateway, canned):
    gateway.route("GET", "/v1/balance", gateway.ok(canned["balance"], request_id="req_b", cost="0"))
    with gateway.gym() as gym:
        balance = gym.balance()
    assert isinstance(balance, rsigym.Balance)
    assert (balance.budget_usd, balance.spent_usd, balance.reserved_usd, balance.remaining_usd) == (
        5.0,
        1.7,
        0.09,
        3.21,
    )
    assert (balance.request_id, balance.cost_usd) == ("req_b", 0.0)
    assert balance.model_dump() == canned["balance"]  # metadata is not data
    assert gateway.requests[0].headers["User-Agent"].startswith("rsigym-sdk/")


def test_models_list(gateway, canned):
    gateway.route("GET", "/rollout/v1/models", gateway.ok(canned["models"], request_id="req_m"))
    with gateway.gym() as gym:
        models = gym.rollout.models()
    assert isinstance(models, list) and isinstance(models, rsigym.ObjectList)
    assert [m.id for m in models] == ["teacher", "tiny-local"]
    assert models[0].pricing == {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    assert models[1].pricing is None
    assert models.request_id == "req_m"


def test_chat_sends_openai_body_and_exposes_cost(gateway, canned):
    gateway.route(
        "POST",
        "/rollout/v1/chat/completions",
        gateway.ok(canned["completion"], request_id="req_c", cost="0.000123", remaining="4.87"),
    )
    with gateway.gym() as gym:
        completion = gym.rollout.chat(model="teacher", messages=HI, max_tokens=32, temperature=None, stop=["\n"])
    assert gateway.json_sent() == {"model": "teacher", "messages": HI, "max_tokens": 32, "stop": ["\n"]}
    assert isinstance(completion, rsigym.ChatCompletion)
    assert completion.text == "Hello there."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == 8
    assert completion.usage.cost_usd == 0.000123
    assert completion.system_fingerprint == "fp_local"  # unknown fields are kept
    assert (completion.request_id, completion.cost_usd, completion.remaining_usd) == ("req_c", 0.000123, 4.87)


def test_chat_without_id_or_created_still_parses(gateway, canned):
    body = {**canned["completion"], "id": None, "created": None}  # a provider may leave them out
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.ok(body))
    with gateway.gym() as gym:
        assert gym.rollout.chat(model="teacher", messages=HI).text == "Hello there."


def test_chat_accepts_pydantic_messages(gateway, canned):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.ok(canned["completion"]))
    with gateway.gym() as gym:
        gym.rollout.chat(model="teacher", messages=[rsigym.ChatMessage(role="user", content="hi")])
    assert gateway.json_sent()["messages"] == HI


@pytest.mark.parametrize("messages", ["hi", {"role": "user", "content": "hi"}, [("user", "hi")]])
def test_malformed_messages_fail_before_any_request(gateway, messages):
    with gateway.gym() as gym, pytest.raises(TypeError, match="message"):
        gym.rollout.chat(model="teacher", messages=messages)
    assert gateway.requests == []


def test_unparsable_cost_header_is_none(gateway, canned):
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.ok(canned["completion"], cost="n/a"))
    with gateway.gym() as gym:
        assert gym.rollout.chat(model="teacher", messages=HI).cost_usd is None


def test_keys_mint_sends_only_what_was_given_and_returns_the_secret(gateway):
    minted = {  # the gateway's key_view plus the one-time plaintext
        "id": "ck_1",
        "key": "rsg_child_secret",
        "name": "harness",
        "prefix": "rsg_chi",
        "parent_id": "run_1",
        "run_id": "run_1",
        "track": "joint",
        "status": "active",
        "budget_usd": 1.5,
        "policy": {"services": ["inference"]},
        "spent_usd": 0.0,
        "reserved_usd": 0.0,
        "created_at": "2025-01-02T03:04:05+00:00",
        "remaining_usd": 1.5,
    }
    gateway.route("POST", "/v1/keys", gateway.ok(minted, status=201, request_id="req_k"))
    with gateway.gym() as gym:
        key = gym.keys.mint(name="harness", budget_usd=1.5, policy={"services": ["inference"]})
    assert gateway.json_sent() == {"name": "harness", "budget_usd": 1.5, "policy": {"services": ["inference"]}}
    assert isinstance(key, rsigym.ChildKey)
    assert (key.id, key.key, key.parent_id, key.status, key.request_id) == (
        "ck_1",
        "rsg_child_secret",
        "run_1",
        "active",
        "req_k",
    )
    assert key.created_at.year == 2025
    assert (key.track, key.remaining_usd) == ("joint", 1.5)  # the key's own budget left, from the body
    assert "rsg_child_secret" not in repr(key)


def test_keys_mint_with_nothing_sends_an_empty_object(gateway):
    gateway.route("POST", "/v1/keys", gateway.ok({"id": "ck_2", "status": "active"}))
    with gateway.gym() as gym:
        assert gym.keys.mint().key is None
    assert gateway.json_sent() == {}


def test_keys_list_and_revoke(gateway):
    gateway.route(
        "GET",
        "/v1/keys",
        gateway.ok(
            {
                "object": "list",
                "data": [
                    {"id": "ck_1", "name": "a", "parent_id": "run_1", "status": "active"},
                    {"id": "ck_2", "name": None, "parent_id": "run_1", "status": "revoked"},
                ],
            }
        ),
    )
    gateway.route("POST", "/v1/keys/ck_1/revoke", gateway.ok({"id": "ck_1", "parent_id": "run_1", "status": "revoked"}))
    with gateway.gym() as gym:
        keys = gym.keys.list()
        revoked = gym.keys.revoke("ck_1")
    assert [(k.id, k.status) for k in keys] == [("ck_1", "active"), ("ck_2", "revoked")]
    assert all(k.key is None for k in keys)
    assert revoked.status == "revoked"


def test_ids_cannot_escape_their_path_segment(gateway):
    with gateway.gym() as gym, pytest.raises(rsigym.NotFoundError):
        gym.keys.revoke("../../admin/v1/keys/x")
    assert gateway.requests[0].url.raw_path == b"/v1/keys/..%2F..%2Fadmin%2Fv1%2Fkeys%2Fx/revoke"
    with pytest.raises(ValueError):
        gym.keys.revoke("")


def test_malformed_success_body_is_a_validation_error(gateway):
    gateway.route("GET", "/v1/balance", gateway.ok({"budget_usd": "lots"}, request_id="req_bad"))
    gateway.route("GET", "/v1/keys", httpx.Response(200, text="<html>login</html>"))
    with gateway.gym() as gym:
        with pytest.raises(rsigym.APIResponseValidationError) as info:
            gym.balance()
        assert info.value.request_id == "req_bad"
        with pytest.raises(rsigym.APIResponseValidationError):
            gym.keys.list()


# ---- lifecycle -------------------------------------------------------------------------


def test_context_manager_closes_its_own_client_only():
    with rsigym.Gym(base_url="http://x", api_key="k") as own:
        pass
    assert own.is_closed
    http = httpx.Client()
    with rsigym.Gym(base_url="http://x", api_key="k", http_client=http):
        pass
    assert not http.is_closed
    http.close()


def test_timeout_is_applied_to_requests(gateway, canned):
    gateway.route("GET", "/v1/balance", gateway.ok(canned["balance"]))
    with gateway.gym(timeout=7.5) as gym:
        gym.balance()
    assert gateway.requests[0].extensions["timeout"]["read"] == 7.5


# ---- async ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_surface_matches_sync(gateway, canned):
    gateway.route("GET", "/v1/balance", gateway.ok(canned["balance"], remaining="3.21"))
    gateway.route("GET", "/rollout/v1/models", gateway.ok(canned["models"]))
    gateway.route("POST", "/rollout/v1/chat/completions", gateway.ok(canned["completion"], cost="0.01"))
    gateway.route("POST", "/v1/keys", gateway.ok({"id": "ck_9", "key": "rsg_x", "status": "active"}))
    gateway.route("GET", "/v1/keys", gateway.ok({"data": [{"id": "ck_9", "status": "active"}]}))
    gateway.route("POST", "/v1/keys/ck_9/revoke", gateway.ok({"id": "ck_9", "status": "revoked"}))
    async with gateway.async_gym() as gym:
        assert (await gym.balance()).remaining_usd == 3.21
        assert [m.id for m in await gym.rollout.models()] == ["teacher", "tiny-local"]
        completion = await gym.rollout.chat(model="teacher", messages=HI)
        assert (completion.text, completion.cost_usd) == ("Hello there.", 0.01)
        assert (await gym.keys.mint(name="n")).key == "rsg_x"
        assert [k.id for k in await gym.keys.list()] == ["ck_9"]
        assert (await gym.keys.revoke("ck_9")).status == "revoked"
    assert [(r.method, r.url.path) for r in gateway.requests] == [
        ("GET", "/v1/balance"),
        ("GET", "/rollout/v1/models"),
        ("POST", "/rollout/v1/chat/completions"),
        ("POST", "/v1/keys"),
        ("GET", "/v1/keys"),
        ("POST", "/v1/keys/ck_9/revoke"),
    ]


@pytest.mark.asyncio
async def test_async_context_manager_closes_its_own_client():
    async with rsigym.AsyncGym(base_url="http://x", api_key="k") as gym:
        pass
    assert gym.is_closed
