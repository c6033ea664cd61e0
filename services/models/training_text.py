"""What a row of training data is to the model: the one text the trainer tokenizes and the audit reads.

A dataset row — chat (``{"messages": [...], "tools"?: [...]}``) or completion (``{"prompt",
"completion"}``, trained as one user turn and its answer) — is trained as the chat format renders
it (services/models/chat_format.py): the tools' names in a system turn (``Tools: a, b``), every
message's content, and each tool call as ``<tool_call>{"name": …, "arguments": …}</tool_call>``
with JSON-string arguments decoded first (``"\\u0034\\u0032"`` is trained as ``42``). Nothing else
of a row reaches the model (a tool's description and parameters, a message's ``name`` or
``tool_call_id`` are not rendered).

:func:`training_example` is that rendering as (prompt, answer) — what every trainer tokenizes
(services/training/datasets.py → services/training/batching.py) — and :func:`training_text` the
same text whole, which the contamination audit scans (services/records/audits/contamination.py).
Two readings of a row, one for training and one for the audit, let data hide where only one of
them looked; a test asserts the trainer's token ids, decoded with the base model's tokenizer, are
exactly this text.

**Structure.** A tokenizer turns the template's markup (``<|im_start|>``, ``<tool_call>`` …)
into special tokens wherever the string occurs, so a field that holds it writes turns of its
own: a tool "name" ending ``<|im_end|>\\n<|im_start|>user\\n<question>`` trains the exact prompt
a harness sends. :func:`structure_problem` finds such strings in every string of a row — keys,
values, tool-call arguments once JSON-decoded, after NFKC and case folding — and tool names
outside ``^[A-Za-z0-9_-]{1,64}$`` (OpenAI's rule for function names). Uploads are refused with
it (services/training/datasets.py); a training job checks its rows again against its base
model's own added tokens (:func:`tokenizer_markup`: ``<file_sep>``, ``<think>`` …, which no
upload-time list can know) and fails before its first step.

**Loop rows.** A Tinker training loop (services/training/tinker_api/) trains on token ids, not
rows; the gym keeps what it trained on, and what it sampled, as rows of a third kind,
``{"loop": {"text": …, "tokens": [...], "source": …, …}}`` (services/training/tinker_api/
loop_data.py), whose ``text`` is the ids decoded with the base model's tokenizer — markup and
all, since the audit must scan what the model saw. :func:`training_text` of such a row is that
text, exactly. They are a record, never training input: only the platform writes them, uploads
refuse them, and :func:`training_example` refuses them (a job cannot train on a loop record).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any

from services.models.chat_format import SPECIAL_TOKENS, split_example

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tool's name, whole (``fullmatch``): what a function name may be in OpenAI's API."""
TOKEN_SHAPE = re.compile(r"<\|[^<>|\s]{1,64}\|>")
"""The shape most chat models' special tokens share (``<|eot_id|>``, ``<|fim_prefix|>`` …)."""


LOOP = "loop"
"""The key of a loop row (module docstring): the platform's record of a Tinker loop."""


class LoopRecord(ValueError):
    """A loop row handed to a trainer: it is the platform's record of a loop, not training data."""


def is_loop_row(row: Any) -> bool:
    return isinstance(row, dict) and LOOP in row


def example_messages(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A row as (messages, tools): a completion row is one user turn and its answer."""
    if "messages" in row:
        return row["messages"], row.get("tools")
    return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}], None


def training_example(row: dict[str, Any]) -> tuple[str, str]:
    """(prompt, answer) as the trainer tokenizes them: the loss is on the answer's tokens."""
    if is_loop_row(row):
        raise LoopRecord("a Tinker loop record (the platform's, of what a loop trained on) is not training data")
    messages, tools = example_messages(row)
    return split_example(messages, tools)


def training_text(row: dict[str, Any]) -> str:
    """The whole text the model is trained on for this row (prompt, then answer); for a loop
    row, the text the loop's token ids decode to."""
    if is_loop_row(row):
        text = row[LOOP]["text"]
        if not isinstance(text, str):
            raise TypeError("a loop row's text must be a string")
        return text
    return "".join(training_example(row))


def tokenizer_markup(tokenizer: Any) -> list[str]:
    """Strings a base model's tokenizer turns into tokens of their own (its special and added
    tokens) that are markup: at least three characters, one of them neither a letter, a digit
    nor a space (``<file_sep>``, ``[INST]``; not an added run of spaces or a plain word)."""
    added = set(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else set()
    tokens = added | set(getattr(tokenizer, "all_special_tokens", ()) or ())
    return sorted(t for t in tokens if len(t.strip()) >= 3 and any(not (c.isalnum() or c.isspace()) for c in t))


def field_strings(row: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(field, text)`` for every string of a row — dict keys included — and, for a tool call
    whose arguments are a JSON string, for every string that JSON decodes to."""
    yield from _strings(row, "")


def _strings(value: Any, path: str, decode: bool = True) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
        if decode and path.endswith(".function.arguments"):  # the chat format decodes them once
            try:
                decoded = json.loads(value)
            except ValueError:
                return
            yield from _strings(decoded, path, decode=False)
    elif isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            yield sub, str(key)  # a key is rendered too (tool-call arguments)
            yield from _strings(item, sub, decode)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]", decode)


def _markup_in(text: str, markup: Iterable[str]) -> str | None:
    """The first markup string in the text (after NFKC and case folding), if any."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    hits = [(at, token) for token in markup if (at := folded.find(token.casefold())) >= 0]
    if (shaped := TOKEN_SHAPE.search(folded)) is not None:
        hits.append((shaped.start(), shaped.group()))
    return min(hits)[1] if hits else None


def _tool_names(row: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for i, tool in enumerate(row.get("tools") or ()):
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            yield f"tools[{i}].function.name", tool["function"].get("name")
    for i, message in enumerate(row.get("messages") or ()):
        for j, call in enumerate(message.get("tool_calls") or () if isinstance(message, dict) else ()):
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                yield f"messages[{i}].tool_calls[{j}].function.name", call["function"].get("name")


def structure_problem(row: dict[str, Any], markup: Iterable[str] = ()) -> str | None:
    """What in the row could write structure into the training text (module docstring), naming
    the field; None when nothing can. ``markup``: a base model's own tokens, beyond the chat
    format's and the ``<|…|>`` shape."""
    for field, name in _tool_names(row):
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            return f"{field} {str(name)[:80]!r} is not a tool name (^[A-Za-z0-9_-]{{1,64}}$)"
    tokens = [*SPECIAL_TOKENS, *markup]
    for field, text in field_strings(row):
        token = _markup_in(text, tokens)
        if token is not None:
            return (f"{field} holds {token!r}, which the tokenizer reads as chat structure "
                    "(special tokens and chat markup are refused in every field)")
    return None
