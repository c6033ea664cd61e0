"""A request's JSON body decoded into text the gym can hold, or the standard refusal.

Python's ``json`` reads more than Unicode text: given bytes it decodes them with
``surrogatepass`` (so UTF-8-encoded surrogates, ``b"\\xed\\xa0\\x80"``, come through), and a
``"\\ud800"`` escape without its pair becomes a lone surrogate. Such a string breaks the first
code that encodes it (a cost estimate measuring the prompt's UTF-8 bytes, an SQL parameter, an
upstream request): a 500 after the body was accepted. And ``"\\u0000"`` (NUL) is valid JSON that
PostgreSQL's text cannot hold. So the gym decodes every JSON request body here, once, where it
is parsed (the gateway's proxy, ``parse_json_object`` in kit/body_limits.py; the
services' ``json_object`` and the gateway's own body models, ``TextJsonRoute``, in
kit/http.py):

* the body must be UTF-8 (RFC 8259 §8.1; a leading byte-order mark is allowed): overlong
  forms, surrogates and stray bytes are refused 400 ``invalid_request_error``;
* no string (object key or value) may hold a lone surrogate: refused 422, ``param`` naming the
  field (``messages.0.content``);
* nor NUL, unless the route's text is a model's prompt (``Operation.allows_nul``: relayed to the
  provider and kept only as escaped JSON); every other route refuses it 422 the same way.

Nothing is billed for a refused body: the gateway decodes it before any reservation.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

from kit.errors import InvalidRequest, Unprocessable

_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
                             rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u)[dD][c-fC-F])")
"""An escape that decodes to NUL or to a lone surrogate (a high one not followed by a low one, or a
low one not right after a high one), searched for in a body whose escaped backslashes are blanked
out first (:func:`_suspect`): only a body holding one is walked. A pair (an emoji, as
``ensure_ascii`` writes it) is not. Surrogates cannot come any other way: the strict UTF-8 decode
refuses them raw. (The pattern starts with its literal ``\\u``, so the scan runs at C speed:
~0.4 µs for a 1 KB ASCII chat, ~6 µs when it holds 50 escaped emoji.)"""


def _suspect(raw: bytes) -> bool:
    """Whether ``raw`` may decode to a string :func:`unholdable` refuses. An escaped backslash
    (``\\\\``) is blanked out first, two bytes for two (C speed): ``"\\\\ud800"`` is text, not
    an escape, and in ``"\\ud83d\\\\\\ude00"`` the two halves are not a pair."""
    return _SUSPECT_ESCAPE.search(raw.replace(b"\\\\", b"..") if b"\\\\" in raw else raw) is not None


NOT_UTF8 = "the request body is not UTF-8 text"


def decode_utf8(raw: bytes) -> str:
    """``raw`` as text (a leading byte-order mark dropped), or a 400 saying where it stops being UTF-8."""
    try:
        return (raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"{NOT_UTF8} (invalid byte at offset {err.start})") from err


def loads_body(raw: bytes, *, allows_nul: bool = False) -> Any:
    """The JSON value of ``raw``: UTF-8 (400 otherwise), its strings all Unicode and NUL-free
    unless ``allows_nul`` (422 naming the field otherwise). A body that is not JSON raises
    ``ValueError`` (``json.JSONDecodeError``), a too deep one ``RecursionError``, as
    ``json.loads`` does: the caller answers those in its own words."""
    value = json.loads(decode_utf8(raw))
    if _suspect(raw):
        refuse_unholdable(value, allows_nul=allows_nul)
    return value


def unholdable(value: Any, *, allows_nul: bool = False) -> tuple[str, str] | None:
    """The first string in ``value`` (keys included) the gym cannot hold, as (dotted path, what
    is wrong), or None. The path never repeats the offending text, so it can go into an error
    body (an answer holding a lone surrogate could not be encoded either)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            problem = _problem(node, allows_nul)
            if problem is not None:
                return ".".join(path), problem
        elif isinstance(node, dict):
            for key in node:
                problem = _problem(key, allows_nul) if isinstance(key, str) else None
                if problem is not None:
                    return ".".join(path), f"an object key {problem.removeprefix('a string ')}"
            stack.extend((child, (*path, str(key))) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, (*path, str(i))) for i, child in enumerate(node))
    return None


def refuse_unholdable(value: Any, *, allows_nul: bool = False) -> None:
    """A 422 naming the first field :func:`unholdable` finds."""
    found = unholdable(value, allows_nul=allows_nul)
    if found is not None:
        param, problem = found
        raise Unprocessable(f"{param or 'the request body'}: {problem}", param=param or None)


_SURROGATES = re.compile("[\ud800-\udfff]")


def _problem(text: str, allows_nul: bool) -> str | None:
    if not text.isascii() and _SURROGATES.search(text) is not None:
        return "a string holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not Unicode text"
    if not allows_nul and "\x00" in text:
        return "a string holds NUL (U+0000), which this route does not take"
    return None
