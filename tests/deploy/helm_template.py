"""A renderer for the subset of Helm's template language the rsigym chart uses, so that the
deploy tests can check the manifests the chart really produces (env blocks, args, selectors,
indentation) on a machine without the ``helm`` binary.

It follows Go text/template and Helm semantics for what it implements — whitespace trimming,
``$`` and variable scopes, pipelines (the previous result is the last argument), map ranges in
key order, truthiness, named templates (``define`` / ``include`` / ``tpl``, each file a template
named ``<chart>/templates/<file>``) and the Sprig functions listed in ``FUNCTIONS`` — and refuses
anything else with :class:`TemplateError`, so a construct it does not know fails the test instead
of rendering silently wrong. It is not a general Helm: no ``lookup``, no subcharts, no
``.Capabilities``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    pass


# ---- lexing: text and actions ----------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def _split(source: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", body)] with Go's ``{{-`` / ``-}}`` whitespace trimming applied."""
    parts: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(source):
        text = source[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m[1]:
            text = text.rstrip()
        if text:
            parts.append(("text", text))
        parts.append(("action", m[2].strip()))
        trim_next, pos = bool(m[3]), m.end()
    tail = source[pos:]
    if trim_next:
        tail = tail.lstrip()
    if tail:
        parts.append(("text", tail))
    return parts


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<declare>:=)
  | (?P<assign>=)
  | (?P<punct>[()|,])
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.X)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise TemplateError(f"cannot parse {expr[pos:]!r} in {{{{ {expr} }}}}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m[0]))
    return out


# ---- the syntax tree -------------------------------------------------------------------------------

@dataclass
class Pipeline:
    declare: list[str]
    assign: bool  # `$x = …` (assign) rather than `$x := …` (declare)
    commands: list[list[Any]]  # each command: operands (tokens or nested Pipelines)


@dataclass
class Node:
    kind: str  # text, action, if, range, with, define
    text: str = ""
    pipe: Pipeline | None = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)
    name: str = ""


def _parse_pipeline(tokens: list[tuple[str, str]]) -> Pipeline:
    declare: list[str] = []
    assign = False
    for i, (kind, _) in enumerate(tokens):
        if kind in ("declare", "assign"):
            names = [v for k, v in tokens[:i] if k == "var"]
            if len(names) == len([t for t in tokens[:i] if t[0] != "punct"]):
                declare, assign, tokens = names, kind == "assign", tokens[i + 1:]
            break
    pipe, _ = _parse_commands(tokens, 0)
    return Pipeline(declare, assign, pipe)


def _parse_commands(tokens: list[tuple[str, str]], pos: int) -> tuple[list[list[Any]], int]:
    commands: list[list[Any]] = [[]]
    while pos < len(tokens):
        kind, value = tokens[pos]
        if value == ")":
            return commands, pos
        if value == "|":
            commands.append([])
        elif value == "(":
            inner, pos = _parse_commands(tokens, pos + 1)
            if pos >= len(tokens) or tokens[pos][1] != ")":
                raise TemplateError("unclosed (")
            commands[-1].append(Pipeline([], False, inner))
        else:
            commands[-1].append((kind, value))
        pos += 1
    return commands, pos


def parse(source: str) -> list[Node]:
    root: list[Node] = []
    stack: list[tuple[Node | None, list[Node]]] = [(None, root)]
    for kind, body in _split(source):
        current = stack[-1][1]
        if kind == "text":
            current.append(Node("text", text=body))
            continue
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"unclosed comment {body[:30]!r}")
            continue
        word = body.split(None, 1)[0] if body else ""
        rest = body[len(word):].strip()
        if word in ("if", "range", "with"):
            node = Node(word, pipe=_parse_pipeline(_tokens(rest)))
            current.append(node)
            stack.append((node, node.body))
        elif word == "define":
            node = Node("define", name=json.loads(rest))
            current.append(node)
            stack.append((node, node.body))
        elif word == "else":
            owner = stack[-1][0]
            if owner is None or owner.kind == "define":
                raise TemplateError("else outside a block")
            stack.pop()
            if rest.startswith("if "):
                # else if: an if in the else branch; the one {{ end }} closes the whole chain.
                nested = Node("if", pipe=_parse_pipeline(_tokens(rest[3:])))
                owner.orelse.append(nested)
                stack.append((nested, nested.body))
            else:
                stack.append((owner, owner.orelse))
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        elif word in ("template", "block", "break", "continue"):
            raise TemplateError(f"{{{{ {word} }}}} is not supported by this renderer")
        else:
            current.append(Node("action", pipe=_parse_pipeline(_tokens(body))))
    if len(stack) != 1:
        raise TemplateError(f"{len(stack) - 1} block(s) not closed")
    return root


# ---- values --------------------------------------------------------------------------------------

def truthy(value: Any) -> bool:
    return not (value is None or value is False or value == 0 or value == "" or value == [] or value == {})


def to_text(value: Any) -> str:
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        raise TemplateError(f"printing a {type(value).__name__} needs toYaml/toJson: {value!r}")
    return str(value)


def _go_printf(fmt: str, *args: Any) -> str:
    values = iter(args)

    def one(m: re.Match[str]) -> str:
        verb = m[1]
        if verb == "%":
            return "%"
        value = next(values)
        if verb == "q":
            return json.dumps(to_text(value))
        if verb == "d":
            return str(int(value))
        if verb in ("s", "v"):
            return to_text(value)
        raise TemplateError(f"printf verb %{verb}")

    return re.sub(r"%([a-z%])", one, fmt)


def _indent(n: int, text: str) -> str:
    pad = " " * int(n)
    return "\n".join(pad + line for line in to_text(text).split("\n"))


def _to_yaml(value: Any) -> str:
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _merge(dst: dict[str, Any], *sources: dict[str, Any]) -> dict[str, Any]:
    """Sprig merge: keys already in ``dst`` win; nested maps merge."""
    for src in sources:
        for key, value in (src or {}).items():
            if key not in dst:
                dst[key] = copy.deepcopy(value)
            elif isinstance(dst[key], dict) and isinstance(value, dict):
                _merge(dst[key], value)
    return dst


def _required(message: str, value: Any) -> Any:
    if value is None or value == "":
        raise TemplateError(f"required: {message}")
    return value


def _index(collection: Any, *keys: Any) -> Any:
    for key in keys:
        if collection is None:
            return None
        collection = collection.get(key) if isinstance(collection, dict) else collection[int(key)]
    return collection


def _print(*args: Any) -> str:
    out = ""
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out += " "
        out += to_text(arg)
    return out


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quote": lambda *a: " ".join(json.dumps(to_text(v)) for v in a),
    "printf": _go_printf,
    "print": _print,
    "toString": to_text,
    "toYaml": _to_yaml,
    "toJson": lambda v: json.dumps(v, sort_keys=True),
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "dict": lambda *a: {to_text(a[i]): a[i + 1] for i in range(0, len(a), 2)},
    "list": lambda *a: list(a),
    "index": _index,
    "required": _required,
    "default": lambda d, *v: v[0] if v and truthy(v[0]) else d,
    "deepCopy": copy.deepcopy,
    "set": lambda d, k, v: (d.__setitem__(k, v), d)[1],
    "merge": _merge,
    "join": lambda sep, items: sep.join(to_text(i) for i in items or []),
    "sha256sum": lambda s: hashlib.sha256(to_text(s).encode()).hexdigest(),
    "trunc": lambda n, s: to_text(s)[:int(n)],
    "trim": lambda s: to_text(s).strip(),
    "trimSuffix": lambda suffix, s: to_text(s).removesuffix(suffix),
    "contains": lambda sub, s: sub in to_text(s),
    "replace": lambda old, new, s: to_text(s).replace(old, new),
    "not": lambda v: not truthy(v),
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "and": lambda *a: next((v for v in a if not truthy(v)), a[-1]),
    "or": lambda *a: next((v for v in a if truthy(v)), a[-1]),
    "empty": lambda v: not truthy(v),
}


# ---- execution -----------------------------------------------------------------------------------

class Renderer:
    def __init__(self, templates: dict[str, str]):
        """``templates``: template name (``<chart>/templates/<file>``) → source."""
        self.sources = templates
        self.named: dict[str, list[Node]] = {}
        self.trees: dict[str, list[Node]] = {}
        for name, source in templates.items():
            tree = parse(source)
            self.trees[name] = tree
            self.named[name] = tree
            self._collect_defines(tree)

    def _collect_defines(self, nodes: list[Node]) -> None:
        for node in nodes:
            if node.kind == "define":
                self.named[node.name] = node.body

    def render(self, name: str, data: Any) -> str:
        return self._exec(self.trees[name], data, [{"$": data}])

    def include(self, name: str, data: Any) -> str:
        if name not in self.named:
            raise TemplateError(f"no template {name!r}")
        return self._exec(self.named[name], data, [{"$": data}])

    def tpl(self, source: str, data: Any) -> str:
        tree = parse(source)
        self._collect_defines(tree)
        return self._exec(tree, data, [{"$": data}])

    # -- nodes --

    def _exec(self, nodes: list[Node], dot: Any, scopes: list[dict[str, Any]]) -> str:
        out = []
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
            elif node.kind == "define":
                continue
            elif node.kind == "action":
                assert node.pipe is not None
                value = self._pipeline(node.pipe, dot, scopes)
                if not node.pipe.declare:
                    out.append(to_text(value))
            elif node.kind == "if":
                inner = [*scopes, {}]
                assert node.pipe is not None
                branch = node.body if truthy(self._pipeline(node.pipe, dot, inner)) else node.orelse
                out.append(self._exec(branch, dot, inner))
            elif node.kind == "with":
                inner = [*scopes, {}]
                assert node.pipe is not None
                value = self._pipeline(node.pipe, dot, inner)
                out.append(self._exec(node.body, value, inner) if truthy(value) else self._exec(node.orelse, dot, inner))
            elif node.kind == "range":
                out.append(self._range(node, dot, scopes))
        return "".join(out)

    def _range(self, node: Node, dot: Any, scopes: list[dict[str, Any]]) -> str:
        assert node.pipe is not None
        names = node.pipe.declare
        value = self._pipeline(Pipeline([], False, node.pipe.commands), dot, scopes)
        if isinstance(value, dict):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif value is None:
            items = []
        else:
            raise TemplateError(f"range over {type(value).__name__}")
        if not items:
            return self._exec(node.orelse, dot, scopes)
        out = []
        for key, item in items:
            scope: dict[str, Any] = {}
            if len(names) == 1:
                scope[names[0]] = item
            elif len(names) == 2:
                scope[names[0]], scope[names[1]] = key, item
            out.append(self._exec(node.body, item, [*scopes, scope]))
        return "".join(out)

    # -- pipelines --

    def _pipeline(self, pipe: Pipeline, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        value: Any = None
        for i, command in enumerate(pipe.commands):
            value = self._command(command, dot, scopes, [value] if i else [])
        if pipe.declare:
            if pipe.assign:
                for scope in reversed(scopes):
                    if pipe.declare[0] in scope:
                        scope[pipe.declare[0]] = value
                        break
                else:
                    raise TemplateError(f"assignment to undeclared {pipe.declare[0]}")
            else:
                scopes[-1][pipe.declare[0]] = value
        return value

    def _command(self, command: list[Any], dot: Any, scopes: list[dict[str, Any]], piped: list[Any]) -> Any:
        if not command:
            raise TemplateError("empty command")
        head = command[0]
        if isinstance(head, tuple) and head[0] == "ident" and head[1] not in ("true", "false", "nil"):
            args = [self._operand(op, dot, scopes) for op in command[1:]] + piped
            return self._call(head[1], args)
        if len(command) > 1 or piped:
            raise TemplateError(f"cannot call a non-function: {command!r}")
        return self._operand(head, dot, scopes)

    def _call(self, name: str, args: list[Any]) -> Any:
        if name == "include":
            return self.include(args[0], args[1])
        if name == "tpl":
            return self.tpl(to_text(args[0]), args[1])
        if name not in FUNCTIONS:
            raise TemplateError(f"function {name!r} is not supported by this renderer")
        return FUNCTIONS[name](*args)

    def _operand(self, op: Any, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        if isinstance(op, Pipeline):
            return self._pipeline(op, dot, scopes)
        kind, value = op
        if kind == "str":
            return json.loads(value)
        if kind == "raw":
            return value[1:-1]
        if kind == "num":
            return float(value) if "." in value else int(value)
        if kind == "ident":
            if value in ("true", "false"):
                return value == "true"
            if value == "nil":
                return None
            return self._call(value, [])
        if kind == "field":
            return dot if value == "." else _fields(dot, value.strip(".").split("."))
        if kind == "var":
            name, _, path = value.partition(".")
            for scope in reversed(scopes):
                if name in scope:
                    return _fields(scope[name], path.split(".")) if path else scope[name]
            raise TemplateError(f"undefined variable {name}")
        raise TemplateError(f"unexpected {value!r}")


def _fields(value: Any, names: list[str]) -> Any:
    for name in names:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise TemplateError(f"can't evaluate field {name} in {type(value).__name__}")
        value = value.get(name)
    return value


# ---- the chart -----------------------------------------------------------------------------------

def render_chart(chart_dir: Path, values: dict[str, Any] | None = None, *, release: str = "prod",
                 namespace: str = "rsigym") -> dict[str, str]:
    """``helm template <release> <chart_dir>`` for this renderer: file name → rendered text
    (partials, files starting with ``_``, are not rendered). ``values`` replaces values.yaml."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    files = {f"{chart['name']}/templates/{p.name}": p.read_text()
             for p in sorted((chart_dir / "templates").iterdir()) if p.is_file()}
    renderer = Renderer(files)
    data = {
        "Values": values if values is not None else yaml.safe_load((chart_dir / "values.yaml").read_text()),
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True},
        "Template": {"BasePath": f"{chart['name']}/templates"},
    }
    out = {}
    for name in files:
        base = name.rsplit("/", 1)[1]
        if base.startswith("_"):
            continue
        data["Template"]["Name"] = name
        out[base] = renderer.render(name, data)
    return out


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a rendered chart."""
    docs = []
    for name, text in rendered.items():
        try:
            docs += [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as err:
            raise AssertionError(f"{name} does not render to valid YAML: {err}\n{text}") from err
    return docs
