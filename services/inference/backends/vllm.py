"""Inference through a vLLM OpenAI-compatible server, with LoRA adapters loaded at runtime.

The gym renders the prompt itself (the same chat format training used) and sends it to
``/v1/completions``; ``/tokenize`` counts prompt tokens for metering. Adapters are loaded with
``/v1/load_lora_adapter`` under their **checkpoint id**: every version has its own name and a
name is never reused for other weights (vLLM served stale adapters from prefix caches when a
name was reloaded with new weights, vLLM #42125). At most ``max_adapters`` are kept loaded;
beyond that the least-recently-used adapter *that no request is using* is unloaded, so an
eviction can never pull an adapter out from under a running generation (vLLM #47724).

The server must run with ``--enable-lora`` (``--max-loras`` ≥ ``max_adapters``,
``--max-lora-rank`` ≥ the ranks agents may train) and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
and must be able to read the checkpoint directories at the paths the registry stores.

All calls are synchronous (httpx): :meth:`VLLMEngine.generate` runs in a worker thread, like
the local engine's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from kit.config import BaseModel_
from kit.errors import GymError, ServiceUnavailable, UpstreamError, UpstreamTimeout
from services.inference.backends.base import Adapter, Generation, Sampling
from services.models.chat_format import EOT, IM_END

log = logging.getLogger("rsigym.inference.vllm")

END_MARKERS = [IM_END, EOT]
"""Always sent as stop strings: generation ends at the end of the assistant turn whatever the
server's generation config says, and vLLM never returns a stop string in the text."""


def server_root(url: str) -> str:
    """``http://host:8000``, whether the config says ``…:8000``, ``…:8000/`` or ``…:8000/v1``."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _error_text(response: httpx.Response) -> str:
    """The server's own message: vLLM's ``{"error": {"message"}}``, ``{"message"}`` or FastAPI's ``{"detail"}``."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str):
                return str(body[key])[:500]
    return json.dumps(body)[:500]


class _AdapterGone(Exception):
    """A completion named an adapter the server does not have (e.g. it restarted)."""


@dataclass
class _Slot:
    path: str
    users: int = 0
    ready: bool = False


@dataclass
class _Server:
    """What one vLLM server has loaded, as far as this process knows."""

    root: str
    cond: threading.Condition = field(default_factory=threading.Condition)
    slots: OrderedDict[str, _Slot] = field(default_factory=OrderedDict)
    unloading: set[str] = field(default_factory=set)
    served_name: str | None = None


class VLLMEngine:
    def __init__(self, max_adapters: int = 8, *, timeout_s: float = 300.0, load_timeout_s: float = 180.0,
                 connect_timeout_s: float = 5.0, client: httpx.Client | None = None):
        self.max_adapters = max_adapters
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.load_timeout = httpx.Timeout(load_timeout_s, connect=connect_timeout_s)
        self.client = client or httpx.Client(timeout=self.timeout)
        self._servers: dict[str, _Server] = {}
        self._servers_lock = threading.Lock()
        self._token_counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._counts_lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _server(self, base: BaseModel_) -> _Server:
        if not base.vllm_url:
            raise ServiceUnavailable(f"base model {base.name!r} is served by vLLM but has no vllm_url configured")
        root = server_root(base.vllm_url)
        with self._servers_lock:
            if root not in self._servers:
                self._servers[root] = _Server(root)
            return self._servers[root]

    def _post(self, server: _Server, path: str, body: dict[str, Any], what: str,
              timeout: httpx.Timeout | None = None) -> httpx.Response:
        try:
            return self.client.post(server.root + path, json=body, timeout=timeout or self.timeout)
        except httpx.TimeoutException as err:
            if isinstance(err, httpx.ConnectTimeout):
                raise ServiceUnavailable(f"vLLM server {server.root} is unreachable ({what}): connect timeout") from err
            raise UpstreamTimeout(f"vLLM server {server.root} timed out ({what})") from err
        except httpx.TransportError as err:
            raise ServiceUnavailable(f"vLLM server {server.root} is unreachable ({what}): "
                                     f"{type(err).__name__}: {err}") from err

    @staticmethod
    def _fail(server: _Server, response: httpx.Response, what: str) -> GymError:
        text = f"vLLM server {server.root} refused {what}: HTTP {response.status_code}: {_error_text(response)}"
        if response.status_code == 503:
            return ServiceUnavailable(text)
        return UpstreamError(text)

    def _served_name(self, server: _Server, base: BaseModel_) -> str:
        """The base model's name on the server: the gym's name if served under it, else the one base listed."""
        if server.served_name is not None:
            return server.served_name
        try:
            response = self.client.get(server.root + "/v1/models", timeout=self.timeout)
        except httpx.TransportError as err:
            raise ServiceUnavailable(f"vLLM server {server.root} is unreachable (listing models): "
                                     f"{type(err).__name__}: {err}") from err
        if response.status_code != 200:
            raise self._fail(server, response, "listing models")
        models = response.json().get("data") or []
        ids = [m.get("id") for m in models if isinstance(m, dict)]
        bases = [m.get("id") for m in models if isinstance(m, dict) and not m.get("parent")]
        if base.name in ids:
            name = base.name
        elif len(bases) == 1:
            name = str(bases[0])
        else:
            raise UpstreamError(f"vLLM server {server.root} does not serve base model {base.name!r} "
                                f"(it lists {bases}); start it with --served-model-name {base.name}")
        server.served_name = name
        return name

    # -- prompt tokens --------------------------------------------------------------------

    def prompt_tokens(self, base: BaseModel_, prompt: str) -> int:
        server = self._server(base)
        key = (server.root, prompt)
        with self._counts_lock:
            if key in self._token_counts:
                self._token_counts.move_to_end(key)
                return self._token_counts[key]
        response = self._post(server, "/tokenize", {"model": self._served_name(server, base), "prompt": prompt,
                                                    "add_special_tokens": False}, "tokenize")
        if response.status_code != 200:
            raise self._fail(server, response, "tokenize")
        count = int(response.json()["count"])
        with self._counts_lock:
            self._token_counts[key] = count
            while len(self._token_counts) > 256:
                self._token_counts.popitem(last=False)
        return count

    # -- adapters -------------------------------------------------------------------------

    def loaded_adapters(self, base: BaseModel_) -> list[str]:
        server = self._server(base)
        with server.cond:
            return [k for k, s in server.slots.items() if s.ready]

    def _acquire(self, server: _Server, adapter: Adapter) -> _Slot:
        """Pin ``adapter`` on the server (loading it once if needed) for one generation."""
        with server.cond:
            while True:
                slot = server.slots.get(adapter.key)
                if adapter.key in server.unloading or (slot is not None and not slot.ready):
                    server.cond.wait(timeout=1.0)  # being loaded or unloaded by another thread
                    continue
                if slot is not None:
                    if slot.path != adapter.path:
                        raise UpstreamError(f"adapter name {adapter.key!r} is loaded from {slot.path}, not {adapter.path}:"
                                            " a name is never reused for other weights")
                    slot.users += 1
                    server.slots.move_to_end(adapter.key)
                    return slot
                slot = _Slot(adapter.path, users=1)
                server.slots[adapter.key] = slot
                break
        try:
            self._load(server, adapter)
        except BaseException:
            with server.cond:
                if server.slots.get(adapter.key) is slot:
                    del server.slots[adapter.key]
                server.cond.notify_all()
            raise
        with server.cond:
            slot.ready = True
            victims = self._victims(server)
            server.cond.notify_all()
        self._unload(server, victims)
        return slot

    def _release(self, server: _Server, key: str, slot: _Slot) -> None:
        with server.cond:
            slot.users -= 1
            victims = self._victims(server)
        self._unload(server, victims)

    def _victims(self, server: _Server) -> list[str]:
        """Called holding the lock: LRU adapters beyond the limit that no request is using."""
        victims = []
        while len(server.slots) > self.max_adapters:
            idle = next((k for k, s in server.slots.items() if s.ready and s.users == 0), None)
            if idle is None:
                break  # every loaded adapter is in use; evict when one is released
            del server.slots[idle]
            server.unloading.add(idle)
            victims.append(idle)
        return victims

    def _load(self, server: _Server, adapter: Adapter) -> None:
        what = f"loading adapter {adapter.key}"
        response = self._post(server, "/v1/load_lora_adapter", {"lora_name": adapter.key, "lora_path": adapter.path},
                              what, timeout=self.load_timeout)
        if response.status_code == 200:
            log.info("vLLM %s: loaded adapter %s from %s", server.root, adapter.key, adapter.path)
            return
        text = _error_text(response)
        if response.status_code == 400 and "already" in text.lower():
            # Loaded before (this process restarted, the server did not). Names are never
            # reused for other weights, so what the server holds under this name is this version.
            return
        if response.status_code in (404, 405) and text == "Not Found":
            raise UpstreamError(f"vLLM server {server.root} cannot load adapters at runtime: start it with "
                                "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
        raise self._fail(server, response, what)

    def _unload(self, server: _Server, keys: list[str]) -> None:
        for key in keys:
            try:
                response = self._post(server, "/v1/unload_lora_adapter", {"lora_name": key}, f"unloading adapter {key}")
                if response.status_code not in (200, 404):
                    log.warning("vLLM %s: unloading adapter %s: HTTP %s %s", server.root, key, response.status_code,
                                _error_text(response))
                else:
                    log.info("vLLM %s: unloaded adapter %s", server.root, key)
            except GymError as err:
                log.warning("vLLM %s: unloading adapter %s failed: %s", server.root, key, err.message)
            finally:
                with server.cond:
                    server.unloading.discard(key)
                    server.cond.notify_all()

    def _forget(self, server: _Server, key: str, slot: _Slot) -> None:
        """The server lost an adapter we thought loaded: drop it so the next use reloads it."""
        with server.cond:
            if server.slots.get(key) is slot:
                del server.slots[key]
            server.cond.notify_all()

    # -- generation -----------------------------------------------------------------------

    def generate(self, base: BaseModel_, adapter: Adapter | None, prompt: str, sampling: Sampling,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        server = self._server(base)
        room = base.max_context - self.prompt_tokens(base, prompt)
        if room <= 0:
            return Generation("", 0, "length")
        body: dict[str, Any] = {
            "prompt": prompt, "max_tokens": min(sampling.max_tokens, room), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "stop": [s for s in sampling.stop if s] + END_MARKERS,
            "skip_special_tokens": False,  # tool-call markers are special tokens: they must reach the parser
            "n": 1,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.min_tokens:
            body["min_tokens"] = sampling.min_tokens  # vLLM's own sampling parameter
        if adapter is None:
            body["model"] = self._served_name(server, base)
            return self._complete(server, body, on_text, sampling.cancelled)
        for attempt in (1, 2):
            slot = self._acquire(server, adapter)
            try:
                body["model"] = adapter.key
                return self._complete(server, body, on_text, sampling.cancelled)
            except _AdapterGone as err:
                self._forget(server, adapter.key, slot)
                if attempt == 2:
                    raise UpstreamError(f"vLLM server {server.root} does not serve adapter {adapter.key} "
                                        f"although it was loaded: {err}") from err
                log.warning("vLLM %s lost adapter %s; loading it again", server.root, adapter.key)
            finally:
                self._release(server, adapter.key, slot)
        raise AssertionError("unreachable")

    def _complete(self, server: _Server, body: dict[str, Any], on_text: Callable[[str], None] | None,
                  cancelled: threading.Event | None = None) -> Generation:
        if on_text is None:
            response = self._post(server, "/v1/completions", {**body, "stream": False}, "a completion")
            self._check_completion(server, response, body["model"])
            data = response.json()
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            return Generation(choice.get("text") or "", int(usage.get("completion_tokens") or 0),
                              _finish(choice.get("finish_reason")))
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self.client.stream("POST", server.root + "/v1/completions", json=stream_body,
                                    timeout=self.timeout) as response:
                if response.status_code != 200:
                    response.read()
                    self._check_completion(server, response, body["model"])
                # leaving this block on a cancel closes the connection: vLLM aborts the request
                return self._read_stream(server, response.iter_lines(), on_text, cancelled)
        except httpx.TimeoutException as err:
            if isinstance(err, httpx.ConnectTimeout):
                raise ServiceUnavailable(f"vLLM server {server.root} is unreachable (a completion): connect timeout") from err
            raise UpstreamTimeout(f"vLLM server {server.root} timed out (a streamed completion)") from err
        except httpx.TransportError as err:
            raise ServiceUnavailable(f"vLLM server {server.root} failed during a completion: "
                                     f"{type(err).__name__}: {err}") from err

    def _check_completion(self, server: _Server, response: httpx.Response, model: str) -> None:
        if response.status_code == 200:
            return
        if response.status_code == 404 and model not in (server.served_name,):
            raise _AdapterGone(_error_text(response))
        raise self._fail(server, response, "a completion")

    @staticmethod
    def _read_stream(server: _Server, lines: Iterator[str], on_text: Callable[[str], None],
                     cancelled: threading.Event | None = None) -> Generation:
        parts: list[str] = []
        finish, completion_tokens, chunks = None, None, 0
        for line in lines:
            if cancelled is not None and cancelled.is_set():
                return Generation("".join(parts), completion_tokens if completion_tokens is not None else chunks,
                                  "cancelled")
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                break
            try:
                event = json.loads(payload)
            except ValueError as err:
                raise UpstreamError(f"vLLM server {server.root} sent a malformed stream event: {payload[:200]}") from err
            if event.get("error"):
                err_body = event["error"]
                message = err_body.get("message") if isinstance(err_body, dict) else str(err_body)
                raise UpstreamError(f"vLLM server {server.root} failed during a completion: {message}")
            for choice in event.get("choices") or []:
                piece = choice.get("text") or ""
                if piece:
                    parts.append(piece)
                    on_text(piece)
                chunks += 1
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
            usage = event.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                completion_tokens = int(usage["completion_tokens"])
        if finish is None:
            raise UpstreamError(f"vLLM server {server.root} ended a streamed completion without a finish reason")
        # Without usage (an old server), every chunk carried one token.
        return Generation("".join(parts), completion_tokens if completion_tokens is not None else chunks, _finish(finish))


def _finish(reason: Any) -> str:
    return "length" if reason == "length" else "stop"
