"""Blind labelling by human labellers (``rsigym labels export|import|kappa``).

``export`` writes what two labellers get: ``items.jsonl`` and ``labels.csv`` (a template), one
item per audited run and taxonomy category where the behaviour judge quoted evidence — the
category's definition and the quoted evidence, nothing else. The run's id is replaced by an
opaque ``run-<hex>`` (the same for all of its items, and kept across exports into the same
directory); other gym ids in the evidence become ``<id>``; no verdict of any check, the
judge's included, is in them, and the items are in random order. What maps them back — the run
ids and the judge's code per item — is in ``.key.json`` (mode 0600), for ``kappa`` only: do not
hand it to a labeller.

``import`` checks one labeller's file (CSV with ``item`` and ``label`` columns, or JSONL of
``{"item", "label"}``; labels are the taxonomy's codes) and keeps it as ``labels/<name>.json``.
``kappa`` gives Cohen's kappa between every two labellers and each against the judge, on the items
both labelled: over the six codes, and over "hacking" (EXECUTED or ATTEMPTED_BLOCKED) against not.

Items come from the judge's own findings, so they are the judge's selection of evidence: the
agreement measured is on what the judge chose to quote, not on whole trajectories.
"""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
from pathlib import Path
from typing import Any

from kit.errors import NotFound, Unprocessable
from kit.private_files import write_private
from ops.analyses.agreement import cohen_kappa
from ops.analyses.incidence import newest_per_run
from services.records.audits.taxonomy import CATEGORIES, CODES, SEVERITY

ITEMS, TEMPLATE, KEY, LABELS = "items.jsonl", "labels.csv", ".key.json", "labels"
JUDGE_CHECK = "behaviour"
HACKING = frozenset({"EXECUTED", "ATTEMPTED_BLOCKED"})
_GYM_ID = re.compile(r"\b[a-z]{2,5}_[0-9a-f]{12,}\b")
_LABELLER = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def _scrub(text: str, runs: dict[str, str]) -> str:
    for run_id, anon in runs.items():
        text = text.replace(run_id, anon)
    return _GYM_ID.sub("<id>", text)


def _judged(audit: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """``{category: (the judge's worst code, its evidence quotes)}`` of one audit's behaviour check."""
    out: dict[str, tuple[str, list[str]]] = {}
    for check in (audit.get("report") or {}).get("checks") or []:
        if check.get("name") != JUDGE_CHECK:
            continue
        for f in check.get("findings") or []:
            cat, code, evidence = f.get("category"), f.get("code"), str(f.get("evidence") or "").strip()
            worst, quotes = out.get(cat, ("NOT_APPLICABLE", []))
            worst = code if SEVERITY.get(code, -1) > SEVERITY.get(worst, -1) else worst
            out[cat] = (worst, [*quotes, evidence] if evidence else quotes)
    return out


def _read_key(out: Path) -> dict[str, Any]:
    path = out / KEY
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}, "items": {}}


def export(audits: list[dict[str, Any]], out: Path, runs: set[str] | None = None) -> dict[str, Any]:
    """Write the labelling set into ``out``; ``{"items": n, "runs": n, "dir": …}``."""
    out.mkdir(parents=True, exist_ok=True)
    key = _read_key(out)
    anon: dict[str, str] = {v: k for k, v in key["runs"].items()}  # run id -> anonymous id, kept
    item_of = {(v["run_id"], v["category"]): k for k, v in key["items"].items()}
    items: list[dict[str, Any]] = []
    answers: dict[str, dict[str, Any]] = {}
    by_id = {c.id: c for c in CATEGORIES}
    for run_id, audit in sorted(newest_per_run(audits, runs).items()):
        judged = {c: v for c, v in _judged(audit).items() if v[1] and c in by_id}
        if not judged:
            continue
        anon.setdefault(run_id, f"run-{secrets.token_hex(4)}")
        for cat, (code, quotes) in judged.items():
            item = item_of.get((run_id, cat)) or f"item-{secrets.token_hex(5)}"
            c = by_id[cat]
            items.append({"item": item, "run": anon[run_id], "category": cat, "stage": c.stage, "title": c.title,
                          "definition": c.description, "evidence": [_scrub(q, anon) for q in quotes]})
            answers[item] = {"run_id": run_id, "category": cat, "judge": code, "audit_id": audit.get("id")}
    secrets.SystemRandom().shuffle(items)  # no order to read the runs or the judge's sequence from
    (out / ITEMS).write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["item", "run", "category", "label"])
    writer.writerows([i["item"], i["run"], i["category"], ""] for i in items)
    (out / TEMPLATE).write_text(buf.getvalue(), encoding="utf-8")
    write_private(out / KEY, json.dumps({"runs": {v: k for k, v in anon.items()}, "items": answers,
                                         "codes": list(CODES)}, indent=2))
    return {"items": len(items), "runs": len({i["run"] for i in items}), "dir": str(out)}


def _rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return list(csv.DictReader(io.StringIO(text)))


def import_labels(out: Path, labeller: str, path: Path) -> dict[str, Any]:
    """Check one labeller's file against the export in ``out`` and keep it as ``labels/<name>.json``."""
    if not _LABELLER.match(labeller):
        raise Unprocessable("a labeller's name is 1-40 letters, digits, '-' or '_'", param="labeller")
    key = _read_key(out)
    if not key["items"]:
        raise NotFound(f"no labelling set in {out} (`rsigym labels export --out {out}` first)", param="dir")
    try:
        rows = _rows(path)
    except (OSError, ValueError, csv.Error) as err:
        raise Unprocessable(f"cannot read {path}: {err}", param="file") from None
    labels: dict[str, str] = {}
    for n, row in enumerate(rows, start=1):
        item, label = str(row.get("item") or "").strip(), str(row.get("label") or "").strip().upper()
        if not label:
            continue  # not labelled (yet)
        if item not in key["items"]:
            raise Unprocessable(f"{path} row {n}: no item {item!r} in this labelling set", param="file")
        if label not in CODES:
            raise Unprocessable(f"{path} row {n}: label {label!r} is not one of {', '.join(CODES)}", param="file")
        labels[item] = label
    (out / LABELS).mkdir(exist_ok=True)
    (out / LABELS / f"{labeller}.json").write_text(json.dumps(labels, indent=2, sort_keys=True), encoding="utf-8")
    return {"labeller": labeller, "labelled": len(labels), "items": len(key["items"])}


def _pair(a: dict[str, str], b: dict[str, str]) -> dict[str, Any]:
    common = sorted(set(a) & set(b))
    la, lb = [a[i] for i in common], [b[i] for i in common]
    return {"codes": cohen_kappa(la, lb),
            "hacking": cohen_kappa([str(x in HACKING) for x in la], [str(x in HACKING) for x in lb])}


def kappa(out: Path) -> dict[str, Any]:
    """Agreement of the imported labellers with each other and with the judge."""
    key = _read_key(out)
    if not key["items"]:
        raise NotFound(f"no labelling set in {out} (`rsigym labels export --out {out}` first)", param="dir")
    found = sorted((out / LABELS).glob("*.json")) if (out / LABELS).is_dir() else []
    labellers = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in found}
    judge = {item: v["judge"] for item, v in key["items"].items()}
    names = sorted(labellers)
    return {"items": len(judge), "labellers": {n: len(labellers[n]) for n in names},
            "pairs": [{"a": a, "b": b, **_pair(labellers[a], labellers[b])}
                      for i, a in enumerate(names) for b in names[i + 1:]],
            "vs_judge": [{"labeller": n, **_pair(labellers[n], judge)} for n in names]}


def has_labels(out: Path) -> bool:
    return (out / KEY).is_file()
