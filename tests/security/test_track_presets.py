"""Each track's key, through the real embedded gym, can do what its track opens and nothing it
fixes or revokes (issue 12: data, harness, joint and the offline modifier), and the presets
render against the gym config's [tracks]."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from access.presets import (
    budget_usd,
    parse_track,
    preset_policy,
    submission_needs,
    track_label,
)
from kit.config import GymConfig, smollm2_installed
from kit.errors import Unprocessable
from ops.builder import Gym
from services.training.tables import TrainingJob
from tests.conftest import admin_headers, bearer, client_for, create_key, gym_config

PRICES = {"train_usd_per_mtok": 2.0, "prefill_usd_per_mtok": 0.2, "sample_usd_per_mtok": 0.6}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def track_config(api_base: str) -> GymConfig:
    """The test gym (rollout: teacher, judge) with a second base model, and a teacher catalogue
    narrower than the rollout catalogue so that "teachers only" can be told from "anything"."""
    raw = gym_config(api_base).model_dump()
    raw["models"] = [{"name": "tiny", "path": "builtin:tiny", **PRICES}, {"name": "other", "path": "builtin:tiny", **PRICES}]
    raw["tracks"] = {"teachers": ["teacher"]}
    return GymConfig.model_validate(raw)


@pytest.fixture
def tgym(make_gym: Callable[..., Gym], standin: tuple[str, Any]) -> Gym:
    return make_gym(config=track_config(standin[0]))


def refused(r: Any, param: str | None = None) -> None:
    assert r.status_code == 403, r.text
    assert r.json()["error"]["type"] == "permission_denied"
    if param is not None:
        assert r.json()["error"]["param"] == param, r.json()


def nothing_spent(client: Any, key: str) -> None:
    balance = client.get("/v1/balance", headers=bearer(key)).json()
    assert balance["spent_usd"] == 0 and balance["reserved_usd"] == 0, balance


def training_jobs(gym: Gym, run_id: str) -> int:
    with gym.gateway.store.transaction() as s:
        return int(s.scalar(select(func.count()).select_from(TrainingJob).where(TrainingJob.run_id == run_id)) or 0)


# -- harness -------------------------------------------------------------------------------------


def test_harness_track_has_no_training_and_no_rollout(tgym: Gym) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="harness")
    h = bearer(run["key"])
    refused(client.post("/rollout/v1/chat/completions", json={"model": "teacher", **CHAT}, headers=h), "rollout")
    refused(client.post("/training/v1/jobs", json={"datasets": ["ds_x"], "base_model": "tiny", "steps": 1}, headers=h),
            "training")
    refused(client.post("/training/v1/datasets", files={"file": ("d.jsonl", b'{"text": "x"}\n')}, headers=h), "training")
    nothing_spent(client, run["key"])
    assert training_jobs(tgym, run["id"]) == 0


@pytest.mark.parametrize("path, body", [
    ("/inference/v1/chat/completions", {"model": "other", **CHAT}),
    ("/evaluation/v1/jobs", {"benchmark": "any", "model": "other"}),
    ("/evaluation/v1/submissions", {"harness": "minimal", "base_model": "other"}),
])
def test_harness_track_accepts_only_the_instruct_model(tgym: Gym, path: str, body: dict[str, Any]) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="harness")
    r = client.post(path, json=body, headers=bearer(run["key"]))
    refused(r)
    assert "other" in r.json()["error"]["message"]
    nothing_spent(client, run["key"])
    assert client.get("/evaluation/v1/submissions", headers=bearer(run["key"])).json()["data"] == []


def test_harness_track_submits_a_harness_on_the_instruct_model(tgym: Gym) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="harness")
    h = bearer(run["key"])
    r = client.post("/evaluation/v1/submissions", json={}, headers=h)
    assert r.status_code == 422 and r.json()["error"]["param"] == "harness", r.text
    r = client.post("/evaluation/v1/submissions", json={"harness": "minimal"}, headers=h)
    assert r.status_code == 201 or r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"


# -- data ----------------------------------------------------------------------------------------

OTHER_VALUES = [
    ({"lora": {"rank": 8}}, "lora.rank"),
    ({"lora": {"alpha": 16}}, "lora.alpha"),
    ({"lora": {"dropout": 0.1}}, "lora.dropout"),
    ({"lora": {"target_modules": ["q_proj"]}}, "lora.target_modules"),
    ({"learning_rate": 0.01}, "learning_rate"),
    ({"schedule": "cosine"}, "schedule"),
    ({"steps": 10}, "steps"),
    ({"epochs": 1.0}, "epochs"),
    ({"batch_size": 8}, "batch_size"),
    ({"max_length": 128}, "max_length"),
    ({"seed": 1}, "seed"),
    ({"loss": "custom", "custom_loss": "def loss(logits, labels, mask):\n    return logits.sum()\n"}, "loss"),
    ({"custom_loss": "def loss(logits, labels, mask):\n    return logits.sum()\n"}, "custom_loss"),
    ({"base_model": "other"}, "base_model"),
    ({"parent_checkpoint": "ckpt_mine"}, "parent_checkpoint"),
]


@pytest.mark.parametrize("change, param", OTHER_VALUES, ids=[p for _, p in OTHER_VALUES])
def test_data_track_refuses_every_other_training_setting(tgym: Gym, change: dict[str, Any], param: str) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="data")
    r = client.post("/training/v1/jobs", json={"datasets": ["ds_x"], **change}, headers=bearer(run["key"]))
    refused(r, param)
    nothing_spent(client, run["key"])
    assert training_jobs(tgym, run["id"]) == 0


def test_data_track_fixed_settings_pass_the_policy(tgym: Gym) -> None:
    """The fixed values themselves are not refused: the request reaches the service (which does
    not know the dataset)."""
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="data")
    r = client.post("/training/v1/jobs", json={"datasets": ["ds_missing"], "base_model": "tiny", "lora": {"rank": 16},
                                               "steps": 400}, headers=bearer(run["key"]))
    assert r.status_code == 404 and r.json()["error"]["param"] != "policy", r.text


@pytest.mark.parametrize("path, body", [
    ("/evaluation/v1/jobs", {"benchmark": "any", "model": "tiny", "harness": "h_mine"}),
    ("/evaluation/v1/submissions", {"checkpoint": "ckpt_mine", "harness": "h_mine"}),
])
def test_data_track_keeps_the_minimal_harness(tgym: Gym, path: str, body: dict[str, Any]) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="data")
    refused(client.post(path, json=body, headers=bearer(run["key"])), "harness")
    assert client.get("/evaluation/v1/submissions", headers=bearer(run["key"])).json()["data"] == []


def test_data_track_rollout_is_the_teacher_catalogue(tgym: Gym) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="data")
    h = bearer(run["key"])
    refused(client.post("/rollout/v1/chat/completions", json={"model": "judge", **CHAT}, headers=h), "model")
    nothing_spent(client, run["key"])
    r = client.post("/rollout/v1/chat/completions", json={"model": "teacher", **CHAT}, headers=h)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body", [
    ("/inference/v1/chat/completions", {"model": "other", **CHAT}),
    ("/evaluation/v1/jobs", {"benchmark": "any", "model": "other"}),
])
def test_data_track_serves_only_its_base(tgym: Gym, path: str, body: dict[str, Any]) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="data")
    refused(client.post(path, json=body, headers=bearer(run["key"])))
    nothing_spent(client, run["key"])


# -- joint ---------------------------------------------------------------------------------------


def test_joint_track_fixes_the_base_and_frees_the_settings(tgym: Gym) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="joint")
    h = bearer(run["key"])
    refused(client.post("/training/v1/jobs", json={"datasets": ["ds_x"], "base_model": "other", "steps": 1}, headers=h),
            "base_model")
    free = {"datasets": ["ds_missing"], "base_model": "tiny", "steps": 3, "learning_rate": 0.05,
            "lora": {"rank": 4, "alpha": 8}, "schedule": "cosine", "batch_size": 2, "seed": 7}
    r = client.post("/training/v1/jobs", json=free, headers=h)
    assert r.status_code == 404 and "ds_missing" in r.json()["error"]["message"], r.text  # past the policy
    r = client.post("/training/v1/jobs", json={"datasets": ["ds_missing"], "parent_checkpoint": "ckpt_nope", "steps": 3},
                    headers=h)
    assert r.status_code == 404, r.text  # chaining is allowed; this checkpoint just does not exist
    assert training_jobs(tgym, run["id"]) == 0


# -- offline modifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("create", [{"track": "data", "offline": True}, {"track": "joint", "offline": True},
                                    {"track": "offline"}])
def test_offline_keys_reach_only_the_designated_teacher_and_no_internet(tgym: Gym, create: dict[str, Any]) -> None:
    client = client_for(tgym)
    r = client.post("/admin/v1/keys", json={**create, "budget_usd": 5.0}, headers=admin_headers())
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["track"] == f"{'joint' if create['track'] == 'offline' else create['track']}+offline"
    h = bearer(run["key"])
    refused(client.post("/rollout/v1/chat/completions", json={"model": "judge", **CHAT}, headers=h), "model")
    r = client.post("/sandbox/v2/sandboxes", json={"templateID": "base", "allow_internet_access": True},
                    headers={"X-API-Key": run["key"]})
    assert r.status_code == 403 and r.json()["error"]["param"] == "allow_internet_access", r.text
    assert client.get("/sandbox/v2/sandboxes", headers={"X-API-Key": run["key"]}).json() == []
    nothing_spent(client, run["key"])
    r = client.post("/rollout/v1/chat/completions", json={"model": "teacher", **CHAT}, headers=h)
    assert r.status_code == 200, r.text


def test_offline_harness_still_has_no_rollout(tgym: Gym) -> None:
    client = client_for(tgym)
    run = create_key(client, budget_usd=5.0, track="harness", offline=True)
    assert run["track"] == "harness+offline"
    refused(client.post("/rollout/v1/chat/completions", json={"model": "teacher", **CHAT}, headers=bearer(run["key"])),
            "rollout")


# -- minting: named budgets, bad combinations ----------------------------------------------------


def test_named_budgets_and_their_errors(tgym: Gym) -> None:
    client = client_for(tgym)
    r = client.post("/admin/v1/keys", json={"track": "data", "budget": "small"}, headers=admin_headers())
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["budget_usd"] == budget_usd("data", "small") == 10.0
    for body, param in [
        ({"track": "data", "budget": "huge"}, "budget"),
        ({"track": "data"}, "budget_usd"),
        ({"track": "data", "budget": "small", "budget_usd": 1.0}, "budget_usd"),
        ({"policy": {"services": {}}, "offline": True, "budget_usd": 1.0}, "offline"),
        ({"track": "bogus", "budget_usd": 1.0}, "track"),
    ]:
        r = client.post("/admin/v1/keys", json=body, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (body, r.text)
    assert len(client.get("/admin/v1/keys", headers=admin_headers()).json()["data"]) == 1


def test_cli_keys_create_offline_modifier_and_named_budget(tgym: Gym, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from ops.cli import keys
    from ops.cli import main as cli

    client = client_for(tgym)
    sent: list[dict[str, Any]] = []

    def call(method: str, path: str, data_dir: Any, url: Any, **kw: Any) -> Any:
        sent.append(kw["json"])
        r = client.request(method, path, headers=admin_headers(), **kw)
        assert r.status_code == 201, r.text
        return r.json()

    monkeypatch.setattr(keys, "admin_request", call)
    out = CliRunner().invoke(cli.app, ["keys", "create", "--track", "data", "--offline", "--budget", "large", "--json"])
    assert out.exit_code == 0, out.output
    made = json.loads(out.output)
    assert made["track"] == "data+offline" and made["budget_usd"] == 200.0
    assert sent[-1] == {"budget": "large", "name": None, "track": "data", "offline": True}
    out = CliRunner().invoke(cli.app, ["keys", "create", "--track", "offline", "--budget", "2.5", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["track"] == "joint+offline", out.output
    out = CliRunner().invoke(cli.app, ["keys", "create", "--policy-file", "x.toml", "--offline", "--budget", "1"])
    assert out.exit_code == 2


# -- rendering (unit) ----------------------------------------------------------------------------


def test_presets_render_against_the_tracks_config() -> None:
    raw = GymConfig().model_dump()
    raw["models"] = [{"name": "b", **PRICES}, {"name": "i", **PRICES}]
    raw["rollout"] = {"models": [{"name": n, "litellm_model": f"openai/{n}", "input_usd_per_mtok": 1,
                                  "output_usd_per_mtok": 1} for n in ("t1", "t2", "t3")]}
    raw["tracks"] = {"base_model": "b", "instruct_model": "i", "teachers": ["t1", "t2"], "offline_teacher": "t3"}
    config = GymConfig.model_validate(raw)
    data = preset_policy("data", config)
    assert data.services["rollout"].models == ["t1", "t2"]
    assert data.services["training"].models == ["b"] and data.services["inference"].models == ["b"]
    assert data.services["training"].fields["base_model"].root == {"fixed": "b"}
    assert data.services["training"].fields["parent_checkpoint"].root == {"fixed": None}
    harness = preset_policy("harness", config)
    assert set(harness.services) == {"inference", "evaluation", "sandbox", "records"}
    assert harness.services["inference"].models == ["i"] and harness.services["evaluation"].models == ["i"]
    offline = preset_policy("data", config, offline=True)
    assert offline.services["rollout"].models == ["t3"] and offline.services["sandbox"].internet is False
    assert offline.services["training"] == data.services["training"]
    assert preset_policy("offline", config) == preset_policy("joint", config, offline=True)


def test_tracks_config_defaults_and_checks() -> None:
    t = GymConfig().tracks
    instruct = "smollm2" if smollm2_installed() else "tiny"  # `make install` installs its wheel
    assert (t.base_model, t.instruct_model, t.teachers, t.offline_teacher) == ("tiny", instruct, [], None)
    # an offline gym without a teacher grants no rollout at all
    assert "rollout" not in preset_policy("joint", GymConfig(), offline=True).services
    with pytest.raises(ValueError, match="not a configured base model"):
        GymConfig.model_validate({"tracks": {"base_model": "nope"}})
    with pytest.raises(ValueError, match="not a rollout model"):
        GymConfig.model_validate({"tracks": {"teachers": ["nope"]}})
    with pytest.raises(Unprocessable):
        preset_policy("data", GymConfig(models=[]))


def test_track_labels_needs_and_budgets() -> None:
    assert track_label("data", True) == "data+offline" and track_label("offline") == "joint+offline"
    assert parse_track("harness+offline") == ("harness", True) and parse_track("offline") == ("joint", True)
    assert parse_track(None) == (None, False) and parse_track("data+weird") == (None, False)
    assert submission_needs("data") == ("checkpoint",) and submission_needs("harness+offline") == ("harness",)
    assert submission_needs("joint") == ("checkpoint", "harness") and submission_needs(None) == ()
    assert budget_usd("joint", "standard") == 100.0 and budget_usd("harness", "3.5") == 3.5
    with pytest.raises(Unprocessable):
        budget_usd(None, "small")
