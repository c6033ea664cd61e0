"""``gym rollout …``: frontier / teacher models (OpenAI-compatible): list them, chat."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._client import Gym
from ..types import ChatCompletionChunk
from .arguments import add_json
from .output import echo, echo_err, format_usd, print_json, print_table


def _meta(obj: Any) -> dict[str, Any]:
    return {"request_id": obj.request_id, "cost_usd": obj.cost_usd, "remaining_usd": obj.remaining_usd}


def _cost_line(obj: Any) -> str:
    cost = f"cost {format_usd(obj.cost_usd)}"
    if getattr(obj, "cost_is_upper_bound", False):
        cost = f"cost <= {format_usd(obj.cost_usd)} (reserved)"
    parts = [cost, f"remaining {format_usd(obj.remaining_usd)}"]
    if obj.request_id:
        parts.append(f"request_id {obj.request_id}")
    return "[" + " | ".join(parts) + "]"


def _rollout_models(gym: Gym, args: argparse.Namespace) -> None:
    models = gym.rollout.models()
    if args.json:
        print_json([model.model_dump(mode="json") for model in models])
        return
    if not models:
        echo("no models")
        return
    rows = []
    for model in models:
        prices = " ".join(f"{key}={value}" for key, value in (model.pricing or {}).items())
        rows.append([model.id, prices])
    print_table(rows)


def _read_prompt(prompt: str) -> str:
    return sys.stdin.read() if prompt == "-" else prompt


def _rollout_chat(gym: Gym, args: argparse.Namespace) -> None:
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": _read_prompt(args.prompt)})
    params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.stream:
        _stream_chat(gym, args, messages, params)
        return
    completion = gym.rollout.chat(model=args.model, messages=messages, **params)
    if args.json:
        print_json({**completion.model_dump(mode="json"), "rsigym": _meta(completion)})
        return
    echo(completion.text)
    echo_err(_cost_line(completion))


def _stream_chat(gym: Gym, args: argparse.Namespace, messages: list[dict[str, str]], params: dict[str, Any]) -> None:
    """Plain: the text as it arrives. JSON: one chunk per line, then ``{"rsigym": meta}``.

    Usage is requested so the final chunk carries the exact cost (the headers of a
    stream only know the reserved upper bound).
    """
    params = {**params, "stream_options": {"include_usage": True}}
    with gym.rollout.chat(model=args.model, messages=messages, stream=True, **params) as stream:
        chunk: ChatCompletionChunk
        for chunk in stream:
            if args.json:
                print_json(chunk.model_dump(mode="json"), compact=True)
            else:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    if args.json:
        print_json({"rsigym": _meta(stream)}, compact=True)
    else:
        echo()
        echo_err(_cost_line(stream))


def add_commands(services: Any) -> None:
    rollout = services.add_parser("rollout", help="frontier / teacher models (OpenAI-compatible)")
    rollout_verbs = rollout.add_subparsers(dest="verb", metavar="<verb>", required=True)
    models = rollout_verbs.add_parser("models", help="list the models and their prices")
    add_json(models)
    models.set_defaults(handler=_rollout_models)
    chat = rollout_verbs.add_parser("chat", help="one chat completion")
    chat.add_argument("--model", required=True)
    chat.add_argument("--system", help="system message")
    chat.add_argument("--max-tokens", type=int, dest="max_tokens")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--stream", action="store_true", help="print the reply as it is generated")
    add_json(chat)
    chat.add_argument("prompt", metavar="PROMPT", help="the user message ('-' reads stdin)")
    chat.set_defaults(handler=_rollout_chat)
