"""A chat body whose ``tools`` or ``messages`` is not a list is the schema's 422, never a crash
(the gateway fuzz found ``"tools": -8.6e15`` answered 500 before the refusals looked only at lists)."""

from __future__ import annotations

from typing import Any

import pytest

from kit.errors import GymError, PermissionDenied, Unprocessable
from services.rollout.schemas import parse_chat_request

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": MESSAGES, "tools": -8652374528027347.0},
    {"model": "m", "messages": MESSAGES, "tools": {"type": "function"}},
    {"model": "m", "messages": 3},
    {"model": "m", "messages": {"role": "user"}},
])
def test_a_body_of_the_wrong_shape_is_a_clear_422(body: dict[str, Any]) -> None:
    with pytest.raises(Unprocessable):
        parse_chat_request(body)


def test_a_non_function_tool_in_a_list_is_still_refused() -> None:
    with pytest.raises(PermissionDenied) as err:
        parse_chat_request({"model": "m", "messages": MESSAGES, "tools": [{"type": "web_search"}]})
    assert isinstance(err.value, GymError) and err.value.param == "tools.0.type"
