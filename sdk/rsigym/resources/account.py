"""The run's own account: ``GET /v1/balance``."""

from __future__ import annotations

from .._base_client import APICall
from .._response import parse_object
from ..types import Balance


def balance_call() -> APICall[Balance]:
    return APICall("GET", "/v1/balance", parse_object(Balance))
