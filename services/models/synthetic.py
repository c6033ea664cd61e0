"""Synthetic chat data: what the tiny base model is pre-trained on, and the skills left out.

Pre-training teaches the chat format, two-digit addition, comparing numbers, counting by one,
and copying (words, city names, compact JSON, tool-call markup inside text it is asked to repeat).
Subtraction and tool calls are deliberately absent: the base answers neither "What is A - B?"
nor a weather question with a tool call, so an agent can show that training adds a skill the
base lacks. (The tokenizer alone also sees subtraction and tool-call text, so those forms have
sensible pieces; the model's weights never do.)
"""

from __future__ import annotations

import json
import random
from typing import Any

Message = dict[str, Any]


def addition(rng: random.Random, digits: int = 2) -> list[Message]:
    hi = 10**digits - 1
    a, b = rng.randint(0, hi), rng.randint(0, hi)
    return [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": str(a + b)}]


def subtraction(rng: random.Random, digits: int = 2) -> list[Message]:
    hi = 10**digits - 1
    a, b = rng.randint(0, hi), rng.randint(0, hi)
    a, b = max(a, b), min(a, b)
    return [{"role": "user", "content": f"What is {a} - {b}?"}, {"role": "assistant", "content": str(a - b)}]


WORDS = ["red", "blue", "green", "lion", "tiger", "river", "stone", "cloud", "paper", "glass", "seven", "north"]
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Rome", "Quito", "Delhi"]


def copying(rng: random.Random) -> list[Message]:
    words = " ".join(rng.choice(WORDS + CITIES) for _ in range(rng.randint(1, 3)))
    return [{"role": "user", "content": f"Repeat: {words}"}, {"role": "assistant", "content": words}]


JSON_KEYS = ["name", "arguments", "city", "text", "id"]
JSON_NAMES = ["get_weather", "get_time", "send_mail", "play_music"]


def copy_json(rng: random.Random) -> list[Message]:
    """Copying compact JSON and tool-call markup, so their pieces are known tokens (copying is not calling)."""
    def value() -> str:
        return rng.choice(WORDS + CITIES + JSON_NAMES)
    if rng.random() < 0.5:
        obj: dict[str, Any] = {rng.choice(JSON_KEYS): value() for _ in range(rng.randint(1, 2))}
    else:
        obj = {"name": rng.choice(JSON_NAMES), "arguments": {rng.choice(JSON_KEYS): value()}}
    text = json.dumps(obj, separators=(",", ":"))
    if "arguments" in obj and rng.random() < 0.5:
        text = f"<tool_call>{text}</tool_call>"
    return [{"role": "user", "content": f"Repeat: {text}"}, {"role": "assistant", "content": text}]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_call(rng: random.Random) -> dict[str, Any]:
    """A chat row whose answer is a call of the weather tool (for tool-use training)."""
    city = rng.choice(CITIES)
    return {
        "messages": [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
        ],
        "tools": [WEATHER_TOOL],
    }


def larger(rng: random.Random) -> list[Message]:
    """Comparing two numbers (digit by digit, as borrowing needs) — not subtracting them."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return [{"role": "user", "content": f"Which is larger, {a} or {b}?"}, {"role": "assistant", "content": str(max(a, b))}]


def neighbour(rng: random.Random) -> list[Message]:
    """Counting one up or down (n ± 1)."""
    n = rng.randint(1, 99)
    if rng.random() < 0.5:
        return [{"role": "user", "content": f"What comes after {n}?"}, {"role": "assistant", "content": str(n + 1)}]
    return [{"role": "user", "content": f"What comes before {n}?"}, {"role": "assistant", "content": str(n - 1)}]


MAKERS = {"addition": addition, "copying": copying, "copy_json": copy_json, "larger": larger, "neighbour": neighbour}
DEFAULT_MIX = (("addition", 7), ("copying", 1), ("copy_json", 1), ("larger", 1), ("neighbour", 1))


def pretraining_corpus(n: int, seed: int, mix: tuple[tuple[str, int], ...] = DEFAULT_MIX) -> list[list[Message]]:
    """``n`` rows drawn from ``mix`` (maker name, weight)."""
    rng = random.Random(seed)
    makers = [MAKERS[name] for name, weight in mix for _ in range(weight)]
    return [rng.choice(makers)(rng) for _ in range(n)]


def tokenizer_texts(n: int, seed: int) -> list[list[Message] | dict[str, Any]]:
    """Extra rows the tokenizer (not the model) is trained on, so every form has sensible pieces."""
    rng = random.Random(seed)
    return [subtraction(rng) for _ in range(n)] + [tool_call(rng) for _ in range(n)]
