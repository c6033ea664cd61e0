"""Agent-written text made inert wherever an operator reads it: CLI tables, ``rsigym watch``,
reports, audit findings, logs.

A research agent controls many strings the operator later reads: experiment, key and dataset
names, annotations, its messages on the agent route, error messages its harness raises, file
names. Printed as they are, such a string drives the operator's terminal (``ESC ] 52`` writes
the clipboard, ``ESC [ 2 J`` clears the screen, ``\\r`` overwrites what was printed, U+009B is a
one-byte CSI to some terminals), forges lines in a log, reorders what is shown (bidirectional
overrides) or, printed through Rich or rendered as Markdown, becomes markup: a
``[link=file:///etc/passwd]`` or an ``<img>``. So every such string is shown through one of:

* :func:`inert` — the string with every control character written as a visible escape: C0
  (U+0000–U+001F; tab and newline too, so a table cell, a log field or a finding stays one line,
  unless ``lines`` keeps them for a multi-line text such as an agent's log), DEL, C1
  (U+0080–U+009F), the bidirectional formatting characters and the line and paragraph separators
  (``\\x1b``, ``\\x9b``, ``\\u202e``). Nothing is dropped: the operator sees that it was there;
* :func:`plain` / :class:`PlainTable` — :func:`inert` text as Rich ``Text``, never markup;
* :func:`markdown_inline` — :func:`inert` text with Markdown's and HTML's inline syntax escaped;
* :func:`log_token` — :func:`inert` text that is one token of a ``key=value`` log line (space and
  backslash escaped too: no forged field).

JSON output needs none of these (``json.dumps`` escapes every control character).
"""

from __future__ import annotations

import re
from typing import Any

from rich.table import Table
from rich.text import Text

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_FORMATTING = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
"""Bidirectional marks, embeddings, overrides and isolates; line and paragraph separators."""


def _escapes(codes: list[int]) -> dict[int, str]:
    return {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in codes}


_ONE_LINE = _escapes([*_CONTROLS, *_FORMATTING])
_LINES = {c: e for c, e in _ONE_LINE.items() if c not in (0x09, 0x0A)}
_TOKEN = {**_ONE_LINE, **_escapes([0x20, 0x5C])}
_MARKDOWN = re.compile(r"([\\`*\[\]<>|~&!$#])|(?<![^\W_])_|_(?![^\W_])")
"""Inline Markdown and HTML: emphasis, code, links and images, tags and entities, table pipes,
strikethrough, math; ``#`` for a heading where a line starts with the text. An underscore between
two letters or digits stays as it is (``key_1f3a``): CommonMark never reads it as emphasis."""


def inert(value: Any, *, lines: bool = False) -> str:
    """``value`` as text no terminal, log reader or renderer acts on (see the module docstring);
    ``lines`` keeps tabs and newlines (never a carriage return)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to escape
        return text
    return text.translate(_LINES if lines else _ONE_LINE)


def log_token(value: Any) -> str:
    """``value`` as one token of a ``key=value`` log line: :func:`inert`, space and backslash
    escaped too (``\\x20``, ``\\x5c``, as nginx writes a request line)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and " " not in text and "\\" not in text:
        return text
    return text.translate(_TOKEN)


def markdown_inline(value: Any) -> str:
    """``value`` as literal text in a Markdown line or table cell: :func:`inert`, then every
    character with an inline meaning to Markdown or HTML backslash-escaped."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(), inert(value))


def plain(value: Any, style: str = "") -> Text:
    """``value`` as Rich ``Text``: :func:`inert`, and never read as markup."""
    return Text(inert(value), style=style)


class PlainTable(Table):
    """A Rich table whose string cells are :func:`plain` text: ``[red]`` in a cell is shown, not
    applied. A cell that is already a renderable (``Text`` with a style) is kept as it is."""

    def add_row(self, *renderables: Any, style: Any = None, end_section: bool = False) -> None:
        cells = [plain(r) if isinstance(r, str) else r for r in renderables]
        super().add_row(*cells, style=style, end_section=end_section)
