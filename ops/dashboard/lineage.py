"""A run's experiment graph: what was built from what.

Until the Experiment OS records (issue 11) exist, the graph is assembled from the lineage the
platform already writes itself: datasets → training jobs → checkpoints (each job's parent
checkpoint or base model) → evaluation jobs → scores, plus submissions. The graph is plain
data (:class:`Graph`), so a records-backed builder can later produce the same shape and the
page and its SVG layout stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from services.evaluation import read as evaluation
from services.training import read as training

MAX_NODES = 120
"""A page stays readable: past this many nodes the graph is cut (and says so)."""


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: str  # base_model | dataset | training_job | checkpoint | evaluation | score | submission
    label: str
    detail: str = ""
    href: str | None = None


@dataclass(frozen=True, slots=True)
class Edge:
    src: str
    dst: str
    label: str = ""


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    truncated: bool = False

    def add(self, node: Node) -> None:
        if node.id in self.nodes:
            return
        if len(self.nodes) >= MAX_NODES:
            self.truncated = True
            return
        self.nodes[node.id] = node

    def link(self, src: str, dst: str, label: str = "") -> None:
        if src in self.nodes and dst in self.nodes and Edge(src, dst, label) not in self.edges:
            self.edges.append(Edge(src, dst, label))


def _short(value: str, n: int = 22) -> str:
    return value if len(value) <= n else value[: n - 1] + "…"


def _model_node(graph: Graph, model: str, checkpoints: set[str]) -> str:
    """A model reference is a checkpoint of this run, or a base model (node added on demand)."""
    if model in checkpoints:
        return model
    graph.add(Node(f"base:{model}", "base_model", _short(model), "base model"))
    return f"base:{model}"


def platform_lineage(s: Session, run_id: str) -> Graph:
    graph = Graph()
    datasets = training.run_datasets(s, run_id)
    jobs = training.jobs(s, run_id=run_id)
    ckpts = training.run_checkpoints(s, run_id)
    evals = evaluation.jobs(s, run_id=run_id)
    scores = evaluation.scores(s, run_id=run_id)
    subs = evaluation.submissions(s, run_id=run_id)
    ckpt_ids = {c.id for c in ckpts}

    for d in datasets:
        graph.add(Node(d.id, "dataset", _short(d.name or d.id), f"{d.rows} rows, {d.format}"))
    for j in jobs:
        graph.add(Node(j.id, "training_job", _short(j.id), f"{j.status}, step {j.step}/{j.total_steps}"))
    for c in ckpts:
        graph.add(Node(c.id, "checkpoint", _short(c.id), f"step {c.step}"))
    for j in jobs:
        for dataset_id in j.dataset_ids or []:
            graph.link(dataset_id, j.id, "data")
        if j.parent_checkpoint_id:
            graph.link(j.parent_checkpoint_id, j.id, "parent")
        else:
            graph.link(_model_node(graph, j.base_model, ckpt_ids), j.id, "base")
    for c in ckpts:
        graph.link(c.job_id, c.id, "output")
    for e in evals:
        graph.add(Node(e.id, "evaluation", _short(f"{e.benchmark}/{e.split}"), f"{e.purpose}, {e.status}",
                       href=f"evaluation/{e.id}"))
        graph.link(_model_node(graph, e.model, ckpt_ids), e.id, "evaluated")
    for sub in subs:
        graph.add(Node(sub.id, "submission", _short(sub.id), f"harness {sub.harness}"))
        graph.link(_model_node(graph, sub.model, ckpt_ids), sub.id, "submitted")
    for sc in scores:
        value = "—" if sc.score is None else f"{sc.score:.4f}"
        graph.add(Node(sc.id, "score", f"{sc.benchmark}: {value}", sc.status))
        graph.link(sc.job_id, sc.id, "score")
        if sc.submission_id:
            graph.link(sc.submission_id, sc.id, "of")
    return graph


# -- layout --------------------------------------------------------------------------------------

COL_W, NODE_W, NODE_H, ROW_H, PAD = 200, 176, 40, 54, 12


@dataclass(frozen=True, slots=True)
class PlacedNode:
    node: Node
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class PlacedEdge:
    path: str
    label: str


@dataclass(frozen=True, slots=True)
class Layout:
    width: int
    height: int
    nodes: list[PlacedNode]
    edges: list[PlacedEdge]


def _columns(graph: Graph) -> dict[str, int]:
    """Column = longest path from a source, so lineage reads left to right (cycles cannot
    occur in platform data; a bad edge is simply not followed twice)."""
    incoming: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for e in graph.edges:
        incoming[e.dst].append(e.src)
    col: dict[str, int] = {}

    def depth(n: str, seen: frozenset[str]) -> int:
        if n in col:
            return col[n]
        parents = [p for p in incoming[n] if p not in seen]
        col[n] = 1 + max((depth(p, seen | {n}) for p in parents), default=-1)
        return col[n]

    for n in graph.nodes:
        depth(n, frozenset())
    return col


def layout(graph: Graph) -> Layout:
    col = _columns(graph)
    rows: dict[int, int] = {}
    placed: dict[str, PlacedNode] = {}
    for node_id, node in graph.nodes.items():
        c = col[node_id]
        r = rows.get(c, 0)
        rows[c] = r + 1
        placed[node_id] = PlacedNode(node, PAD + c * COL_W, PAD + r * ROW_H)
    edges = []
    for e in graph.edges:
        a, b = placed[e.src], placed[e.dst]
        x1, y1, x2, y2 = a.x + NODE_W, a.y + NODE_H // 2, b.x, b.y + NODE_H // 2
        mid = (x1 + x2) // 2
        edges.append(PlacedEdge(f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}", e.label))
    width = PAD * 2 + (max(col.values(), default=0) + 1) * COL_W
    height = PAD * 2 + max(rows.values(), default=1) * ROW_H
    return Layout(width, height, list(placed.values()), edges)
