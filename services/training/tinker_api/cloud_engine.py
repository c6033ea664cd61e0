"""The pass-through engine: a Tinker API training model carried out on Tinker's own service.

For a base model the operator runs on Tinker (``backend = "tinker"`` in ``[[models]]``, with
``tinker_base_model`` naming Tinker's model), :class:`~services.training.tinker_api.sessions.TinkerAPI`
uses this engine instead of the local loop: every call the agent's SDK makes to the gym is made
upstream with the real ``tinker`` SDK as the client — ``ServiceClient(base_url=$TINKER_BASE_URL
(default: Tinker's), api_key=$TINKER_API_KEY)``, both read from the platform's provider secrets,
never the agent's. The gym keeps doing what it does for a local model: it meters (the same
reservations), governs (the same policy checks), writes the loop data for the audit (the token
ids are the same) and registers checkpoints — a ``save_weights_for_sampler`` is stored as a
``tinker.json`` manifest (services/models/tinker_client.py) naming the upstream ``tinker://``
path, as a job checkpoint of the tinker backend is, so inference's tinker backend serves it and
submissions accept it. A saved state is a small directory in the gym's states holding the
upstream state path. The agent sees only the gym's own ``tinker://<model>/…`` paths.

Failures: an upstream refusal of the request itself (400/422, or a failed future Tinker marks
as the user's) is the agent's 422; anything else (network, 5xx, the platform's account refused
with 401/402/403/429, a timeout) is the gym's 503 ``service_unavailable`` — the platform's
fault, never the agent's. Upstream paths are scrubbed from the messages.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kit.config import BaseModel_
from kit.errors import GymError, ServiceUnavailable, Unprocessable
from kit.ids import new_id
from services.models.tinker_client import MANIFEST_FORMAT, TINKER_KEY_ENV, TinkerWeights, tinker_manifest

TINKER_URL_ENV = "TINKER_BASE_URL"
"""The Tinker service's URL in the platform's environment (the SDK's own variable); unset: Tinker's."""
UPSTREAM_STATE = "tinker_upstream.json"
"""In a saved state's directory: the upstream state path it stands for."""
CALL_TIMEOUT_S = 900.0
"""How long one upstream call may take before the gym gives up on it (a 503)."""

T = TypeVar("T")
_PATHS = re.compile(r"tinker://\S+")


def _scrub(text: str) -> str:
    return _PATHS.sub("tinker://…", text)


def upstream_error(what: str, err: BaseException) -> GymError:
    """The gym's error for an upstream failure: 422 when Tinker refused the request as the
    caller's mistake, else 503 (the platform's)."""
    if isinstance(err, GymError):
        return err
    import tinker
    from tinker.types import RequestErrorCategory

    detail = _scrub(f"{type(err).__name__}: {err}")
    user = (isinstance(err, tinker.BadRequestError | tinker.UnprocessableEntityError)
            or (isinstance(err, tinker.RequestFailedError)
                and getattr(err, "category", None) == RequestErrorCategory.User))
    if user:
        return Unprocessable(f"the upstream Tinker service refused {what}: {detail}")
    return ServiceUnavailable(f"the upstream Tinker service failed {what}: {detail}")


def upstream(what: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except Exception as err:
        raise upstream_error(what, err) from err


def _plain(value: Any) -> list[Any]:
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


@dataclass
class _Result:
    loss_fn_outputs: list[dict[str, list[Any]]]
    metrics: dict[str, float] = field(default_factory=dict)


class CloudTraining:
    """One upstream training client, shaped like services/training/loop's LoopSession."""

    def __init__(self, service: Any, client: Any, base: BaseModel_, rank: int):
        self.service, self.client, self.base, self.rank = service, client, base, rank

    def _step(self, what: str, data: list[Any], loss_fn: str, config: dict[str, Any], forward_only: bool) -> _Result:
        call = self.client.forward if forward_only else self.client.forward_backward
        out = upstream(what, lambda: call(data, loss_fn, config or None).result(timeout=CALL_TIMEOUT_S))
        outputs = [{k: _plain(v) for k, v in o.items()} for o in out.loss_fn_outputs]
        return _Result(outputs, {k: float(v) for k, v in (out.metrics or {}).items()})

    def forward_backward(self, data: list[Any], loss_fn: str, config: dict[str, Any]) -> _Result:
        return self._step("forward_backward", data, loss_fn, config, forward_only=False)

    def forward(self, data: list[Any], loss_fn: str, config: dict[str, Any]) -> _Result:
        return self._step("forward", data, loss_fn, config, forward_only=True)

    def optim_step(self, adam: Any) -> dict[str, float]:
        out = upstream("optim_step", lambda: self.client.optim_step(adam).result(timeout=CALL_TIMEOUT_S))
        return {k: float(v) for k, v in (getattr(out, "metrics", None) or {}).items()}

    def save_weights_for_sampler(self, directory: Path) -> None:
        """The upstream sampler weights, as the ``tinker.json`` manifest a tinker checkpoint is."""
        name = new_id("sampler")
        path = upstream("save_weights_for_sampler", lambda: str(
            self.client.save_weights_for_sampler(name).result(timeout=CALL_TIMEOUT_S).path))
        TinkerWeights({"format": MANIFEST_FORMAT, "base_model": self.base.tinker_base_model, "path": path,
                       "state_path": None, "rank": self.rank, "passthrough": True}).save_pretrained(directory)

    def save_state(self, directory: Path) -> None:
        name = new_id("state")
        path = upstream("save_state", lambda: str(self.client.save_state(name).result(timeout=CALL_TIMEOUT_S).path))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / UPSTREAM_STATE).write_text(json.dumps({"state_path": path, "rank": self.rank,
                                                            "base_model": self.base.tinker_base_model}))

    def load_state(self, directory: Path, with_optimizer: bool = False) -> None:
        try:
            path = str(json.loads((Path(directory) / UPSTREAM_STATE).read_text())["state_path"])
        except (OSError, ValueError, KeyError) as err:
            raise Unprocessable("this state was not saved on the upstream Tinker service", param="path") from err
        # Loaded into this upstream model (TrainingClient.load_state*, which the SDK marks deprecated
        # for ServiceClient.create_training_client_from_state*: that one names a client-assigned
        # model id, which the gym's own Tinker API — and so the wire fake — does not take yet).
        load = self.client.load_state_with_optimizer if with_optimizer else self.client.load_state
        upstream("load_state", lambda: load(path).result(timeout=CALL_TIMEOUT_S))

    def close(self) -> None:
        self.client = self.service = None


class CloudSampler:
    def __init__(self, client: Any):
        self.client = client

    def sample(self, tokens: list[int], num: int, params: Any) -> list[Any]:
        from tinker import types

        response = upstream("sample", lambda: self.client.sample(
            prompt=types.ModelInput.from_ints(tokens), num_samples=num, sampling_params=params,
        ).result(timeout=CALL_TIMEOUT_S))
        return list(response.sequences)


def _fields(cls: Any, values: dict[str, Any]) -> dict[str, Any]:
    names = set(getattr(cls, "model_fields", {}) or values)
    return {k: v for k, v in values.items() if k in names and v is not None}


class CloudEngine:
    """:class:`~services.training.tinker_api.engine.Engine` over Tinker's service (one
    ``ServiceClient`` for the process, made on first use with the platform's key)."""

    def __init__(self, secrets: Any, client: Any = None):
        self._secrets = secrets
        self._client = client
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                key = self._secrets.get(TINKER_KEY_ENV)
                if not key:
                    raise ServiceUnavailable(f"this gym's Tinker pass-through has no {TINKER_KEY_ENV} configured")
                try:
                    import tinker
                except ImportError as err:
                    raise ServiceUnavailable("the Tinker pass-through needs the cloud extra: "
                                             "pip install 'rsigym[cloud]'") from err
                self._client = tinker.ServiceClient(base_url=self._secrets.get(TINKER_URL_ENV) or None, api_key=key)
            return self._client

    def training(self, *, base_path: Path, rank: int, seed: int, device: str, base: BaseModel_) -> CloudTraining:
        if not base.tinker_base_model:
            raise ServiceUnavailable(f"base model {base.name!r} runs on tinker but has no tinker_base_model configured")
        client = self.client()
        training = upstream("create_model", lambda: client.create_lora_training_client(
            base_model=base.tinker_base_model, rank=rank, seed=seed).result(timeout=CALL_TIMEOUT_S))
        return CloudTraining(client, training, base, rank)

    def sampler(self, *, base_path: Path, adapter_dir: Path, device: str, base: BaseModel_) -> CloudSampler:
        try:
            manifest = tinker_manifest(adapter_dir)
        except ValueError as err:
            raise ServiceUnavailable(str(err)) from err
        if manifest is None:
            raise Unprocessable("these weights were not saved on the upstream Tinker service", param="model_path")
        client = self.client()
        path = str(manifest["path"])
        return CloudSampler(upstream("create_sampling_session", lambda: client.create_sampling_client(
            model_path=path).result(timeout=CALL_TIMEOUT_S)))

    def datum(self, tokens: list[int], loss_fn_inputs: dict[str, list[Any]]) -> Any:
        from tinker import types

        def tensor(values: list[Any]) -> Any:
            ints = bool(values) and all(isinstance(v, int) for v in values)
            return types.TensorData(data=list(values), dtype="int64" if ints else "float32", shape=[len(values)])

        return types.Datum(model_input=types.ModelInput.from_ints(list(tokens)),
                           loss_fn_inputs={k: tensor(v) for k, v in loss_fn_inputs.items()})

    def adam(self, params: dict[str, Any]) -> Any:
        from tinker import types

        return types.AdamParams(**_fields(types.AdamParams, params))

    def sampling_params(self, params: dict[str, Any]) -> Any:
        from tinker import types

        return types.SamplingParams(**_fields(types.SamplingParams, params))

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close("success")
            except Exception:  # noqa: BLE001 - going down; the upstream session expires by itself
                pass
