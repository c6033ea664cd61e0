"""The LLM judge of the behaviour audit: one chat completion from a rollout catalogue model.

The judge is an operator-side call (``rsigym audit``), not an agent's: it is not reserved on
any run's ledger, but it goes through the same LiteLLM backend as agents' rollout calls
(services/rollout/call.py) — one attempt, never a retry (a retry would spend money the audit
report never shows) — and its cost is computed from the catalogue's prices
(services/rollout/metering.py), so the report states what the verdict cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from billing.money import nusd_to_usd
from kit.config import GymConfig
from kit.settings import ProviderSecrets
from services.rollout.call import ProviderCall
from services.rollout.metering import call_cost_nusd, catalogue_model
from services.rollout.schemas import ChatRequest


@dataclass(frozen=True)
class JudgeReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class Judge(Protocol):
    async def complete(self, messages: list[dict[str, Any]]) -> JudgeReply:
        """The judge's answer to ``messages``. Raises a GymError when the provider fails."""
        ...


class RolloutJudge:
    """The judge as a rollout catalogue model (``GymConfig.audit.judge_model``).

    Raises NotFound at construction when ``model_name`` is not in the catalogue."""

    def __init__(self, config: GymConfig, secrets: ProviderSecrets, model_name: str, **litellm_kwargs: Any):
        self.config = config
        self.model_name = model_name
        self.model = catalogue_model(config.rollout, model_name)
        self.backend = ProviderCall(config.rollout, secrets, litellm_kwargs)
        caps = [config.audit.judge_max_tokens, config.rollout.max_tokens_cap]
        if self.model.max_output_tokens:
            caps.append(self.model.max_output_tokens)
        self.max_tokens = min(caps)

    async def complete(self, messages: list[dict[str, Any]]) -> JudgeReply:
        request = ChatRequest.model_validate({"model": self.model_name, "messages": messages, "temperature": 0})
        response = await self.backend.complete(self.model, request, self.max_tokens)
        choices = response.get("choices") or []
        message = (choices[0].get("message") or {}) if choices else {}
        text = message.get("content") or ""
        usage = response.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        cost = call_cost_nusd(self.model, prompt_tokens, completion_tokens)
        return JudgeReply(text=text if isinstance(text, str) else str(text), prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, cost_usd=nusd_to_usd(cost))


def judge_from_config(config: GymConfig, secrets: ProviderSecrets, **litellm_kwargs: Any) -> RolloutJudge | None:
    """The configured judge, or None when ``audit.judge_model`` is unset (the behaviour check then
    reports platform evidence only and the judged categories are INCONCLUSIVE)."""
    if not config.audit.judge_model:
        return None
    return RolloutJudge(config, secrets, config.audit.judge_model, **litellm_kwargs)


AUDITOR_KEY_NAME = "rsigym-auditor"
"""The gym's own root key the judge's rollout calls are metered on (created once, like the
evaluation service's scoring key)."""


class GatewayJudge:
    """The judge through the gym's own gateway and rollout service.

    The records service holds no provider key (only rollout does, and rollout has no store): each
    judge call mints a child of the auditor's root key that may call the judge model only, sends
    one chat completion to ``<gateway>/rollout/v1/chat/completions`` — reserved, metered and
    settled on the auditor's ledger like any call — and revokes the key. The auditor's budget is
    ``audit.judge_budget_usd`` (an operator tops it up with ``rsigym keys topup``)."""

    def __init__(self, config: GymConfig, store: Any, gateway_url: str, model_name: str, *,
                 key_name: str = AUDITOR_KEY_NAME, budget_usd: float | None = None, purpose: str = "audit-judge"):
        """``key_name``/``budget_usd``: the root key the calls are metered on and its budget when it
        is created (default: the auditor's, ``audit.judge_budget_usd``); the live monitor has its own
        (services/records/monitor.py). ``purpose``: the name of each call's child key."""
        self.config, self.store, self.model_name = config, store, model_name
        self.key_name, self.purpose = key_name, purpose
        self.budget_usd = config.audit.judge_budget_usd if budget_usd is None else budget_usd
        self.url = gateway_url.rstrip("/") + "/rollout/v1/chat/completions"
        self.model = catalogue_model(config.rollout, model_name)  # NotFound when not in the catalogue
        caps = [config.audit.judge_max_tokens, config.rollout.max_tokens_cap]
        if self.model.max_output_tokens:
            caps.append(self.model.max_output_tokens)
        self.max_tokens = min(caps)

    def _auditor_key(self, keys: Any) -> str:
        from sqlalchemy import select

        from access.policy import Policy
        from billing.money import usd_to_nusd
        from storage.tables import ApiKey

        with self.store.transaction() as s:
            key_id = s.scalar(select(ApiKey.id).where(ApiKey.name == self.key_name, ApiKey.parent_id.is_(None),
                                                      ApiKey.track.is_(None)))
        if key_id is not None:
            return str(key_id)
        policy = Policy.model_validate({"services": {"rollout": {"models": "*"}}})
        view, _ = keys.create(policy=policy, budget_nusd=usd_to_nusd(self.budget_usd), track=None, name=self.key_name)
        return str(view["id"])

    async def complete(self, messages: list[dict[str, Any]]) -> JudgeReply:
        import httpx

        from access.keys import KeyRegistry
        from access.policy import Policy
        from kit.errors import UpstreamError

        keys = KeyRegistry(self.store)
        policy = Policy.model_validate({"services": {"rollout": {"models": [self.model_name], "max_concurrency": 1}}})
        view, key = keys.create(policy=policy, budget_nusd=None, name=self.purpose, parent_id=self._auditor_key(keys))
        body = {"model": self.model_name, "messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        try:
            async with httpx.AsyncClient(timeout=self.config.rollout.request_timeout_s + 30) as client:
                response = await client.post(self.url, json=body, headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError as err:
            raise UpstreamError(f"the gateway did not answer the judge's call ({type(err).__name__})") from err
        finally:
            keys.set_status(view["id"], "revoked")
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        if response.status_code != 200:
            message = ((answer.get("error") or {}).get("message") if isinstance(answer, dict) else None) or response.text
            raise UpstreamError(f"the judge's rollout call failed ({response.status_code}): {str(message)[:300]}")
        choices = answer.get("choices") or []
        text = ((choices[0].get("message") or {}).get("content") if choices else None) or ""
        usage = answer.get("usage") or {}
        return JudgeReply(text=str(text), prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0),
                          cost_usd=float(usage.get("cost_usd") or response.headers.get("X-RSIGym-Cost-USD") or 0.0))
