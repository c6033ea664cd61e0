"""The two entry points: :class:`Gym` (blocking) and :class:`AsyncGym` (asyncio)."""

from __future__ import annotations

import httpx

from ._base_client import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    AsyncAPIClient,
    SyncAPIClient,
)
from .resources import (
    AsyncEvaluation,
    AsyncInference,
    AsyncKeys,
    AsyncRecords,
    AsyncRollout,
    AsyncSandboxes,
    AsyncTraining,
    Evaluation,
    Inference,
    Keys,
    Records,
    Rollout,
    Sandboxes,
    Training,
)
from .resources.account import balance_call
from .resources.evaluation import submissions_call, submit_call
from .types import Balance, ObjectList, Submission

__all__ = ["Gym", "AsyncGym"]


class Gym(SyncAPIClient):
    """Client of an RSIGym gateway.

    ``base_url`` and ``api_key`` default to ``RSIGYM_URL`` (else
    ``http://127.0.0.1:8700``) and ``RSIGYM_API_KEY``; a missing key raises
    :class:`~rsigym.ConfigurationError` here rather than a 401 later. ``max_retries``
    applies only to refusals (429, 503) and to requests that cannot have reached the
    server; see :mod:`rsigym._retry`. ``http_client`` lets tests and callers supply
    their own ``httpx.Client`` (e.g. with ``httpx.MockTransport``); it is then theirs
    to close.

    ::

        with Gym() as gym:
            print(gym.balance().remaining_usd)
            reply = gym.rollout.chat(model="teacher", messages=[{"role": "user", "content": "hi"}])
            print(reply.text, reply.cost_usd)
    """

    rollout: Rollout
    inference: Inference
    training: Training
    keys: Keys
    sandbox: Sandboxes
    evaluation: Evaluation
    records: Records

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, http_client)
        self.rollout = Rollout(self)
        self.inference = Inference(self)
        self.training = Training(self)
        self.keys = Keys(self)
        self.sandbox = Sandboxes(self)
        self.evaluation = Evaluation(self)
        self.records = Records(self)

    def balance(self) -> Balance:
        """The run's budget, spent, reserved and remaining USD."""
        return self._request(balance_call())

    def submit(self, checkpoint: str | None = None, harness: str | None = None,
               base_model: str | None = None) -> Submission:
        """Hand in the run's result for scoring; the latest submission before the run ends is scored.

        The key's track decides what is required: ``data`` a checkpoint (the minimal harness is
        kept), ``harness`` an uploaded harness id (the base model is kept; ``base_model`` picks
        which), ``joint`` both. A missing or forbidden part is :class:`~rsigym.UnprocessableEntityError`.
        """
        return self._request(submit_call(checkpoint, harness, base_model))

    def submissions(self) -> ObjectList[Submission]:
        """This run's submissions, oldest first."""
        return self._request(submissions_call())


class AsyncGym(AsyncAPIClient):
    """Asyncio twin of :class:`Gym`: same resources, awaitable methods, ``async with``."""

    rollout: AsyncRollout
    inference: AsyncInference
    training: AsyncTraining
    keys: AsyncKeys
    sandbox: AsyncSandboxes
    evaluation: AsyncEvaluation
    records: AsyncRecords

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, max_retries, http_client)
        self.rollout = AsyncRollout(self)
        self.inference = AsyncInference(self)
        self.training = AsyncTraining(self)
        self.keys = AsyncKeys(self)
        self.sandbox = AsyncSandboxes(self)
        self.evaluation = AsyncEvaluation(self)
        self.records = AsyncRecords(self)

    async def balance(self) -> Balance:
        return await self._request(balance_call())

    async def submit(self, checkpoint: str | None = None, harness: str | None = None,
                     base_model: str | None = None) -> Submission:
        return await self._request(submit_call(checkpoint, harness, base_model))

    async def submissions(self) -> ObjectList[Submission]:
        return await self._request(submissions_call())
