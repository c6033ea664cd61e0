"""The reviewer-guided research DAG agent (RSI-Master): a Main agent that never experiments itself,
Workers that run experiments on the directions it assigns, and Reviewers that read the Workers'
evidence straight from the records and write reviews the Main agent then decides on.

* **Main** (the run key) plans directions, starts one Worker per direction — in parallel — then a
  Reviewer over all of them, and reacts to the Workers' findings and the review with a decision:
  ``continue``, ``verify``, ``branch`` or ``revise`` (each starts the next round's Workers on new
  directions, continuing the experiments reacted to) or ``stop`` (it submits the best system the
  records do not flag). It calls training, evaluation and rollout never: its LLM calls go through
  the agent-model route (``/agent/v1``), billed on the run's agent-model meter.
* **Workers** get a child key each: their own records only (a sibling's experiments are 404) and
  aggregate evaluation detail (scores, never per-trial output). A Worker creates its experiment
  (continuing the ones the decision reacted to), states its hypothesis, generates teacher data (the
  teacher's answers to questions of the benchmark's training pool) and
  trains when its direction says so and the track allows it, builds a harness variant when asked,
  evaluates on ``dev`` and writes its finding.
* **Reviewers** get a child key whose records ``owners`` are the Workers they review: they read
  those experiments, findings, checkpoint lineage, dataset samples and per-trial results, and write
  one review spanning them.

The research graph lives in the records and nowhere else: experiments (nodes, with parents),
findings, reviews and ``decision`` annotations (edges: what each decision reacted to and the
directions it opened). A Worker's experiment is named ``<decision id>#<i> <direction>``. A restarted
agent rebuilds where it was from them: directions whose experiment has a finding are done, a
missing review is written, a missing decision is taken. Standard library only (like baseline.py, it
runs under the host's system python in the launcher's namespaces). Every line it prints is
``name: <json>``."""

import argparse
import json
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # -I leaves the script's directory out
import baseline as B  # noqa: E402 - the shared client, track reader and harness variant

ROLE_PROMPT = "RSIGym research DAG. Role: {role}. Answer with one JSON object and nothing else."
PROMPTS = {
    "main-plan": ROLE_PROMPT.format(role="main-plan") + (" You lead the research and never experiment yourself. From `options` (directions "
                                "the track allows), choose at least two to explore in parallel: "
                                '{"directions": [<option>, ...], "rationale": "<why>"}'),
    "reviewer": ROLE_PROMPT.format(role="reviewer") + (" You review workers' experiments from their records: for each, whether its finding "
                               "is supported by the evidence; what is uncertain; comparisons missing; what to run "
                               'next: {"findings_supported": [..], "uncertainties": [..], "missing_comparisons": [..], '
                               '"suggested_next_experiments": [..], "regressions": [..]}'),
    "main-decide": ROLE_PROMPT.format(role="main-decide") + (" You lead the research. React to the workers' results and the review: "
                                  '{"action": "continue|verify|branch|revise|stop", "rationale": "<why>", '
                                  '"directions": [<direction objects for the next round>]}. Stop when `round` '
                                  "reaches `max_rounds`."),
}
DIRECTION_KEYS = ("name", "rows", "steps", "harness", "samples")
lock = threading.Lock()


def say(name: str, value: object) -> None:
    with lock:
        B.say(name, value)


def _first_agent_model() -> str:
    """The first model on the agent route; a gym without one stops the agent with a clear reason."""
    listed = B.call("/agent/v1/models")["data"]
    if not listed:
        raise SystemExit("this gym serves no agent model (GET /agent/v1/models is empty): the DAG agent thinks "
                         "on the agent route, so the gym's config needs an [[agent_models]] entry")
    return str(listed[0]["id"])


def _json_object(text: str) -> dict[str, Any]:
    start, end = text.find("{"), text.rfind("}")
    try:
        found = json.loads(text[start:end + 1]) if start >= 0 else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise B.Refused(f"the model did not answer with a JSON object: {text[:200]!r}")
    return found


def _row(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return line[:500]


def _direction(raw: Any) -> dict[str, Any]:
    """A direction as the Workers run it (unknown keys dropped, sizes bounded)."""
    d = raw if isinstance(raw, dict) else {}
    return {"name": str(d.get("name") or "direction")[:60], "rows": max(0, min(int(d.get("rows") or 0), 5000)),
            "steps": max(1, min(int(d.get("steps") or 1), 2000)), "harness": str(d.get("harness") or "minimal"),
            "samples": max(1, min(int(d.get("samples") or 1), 9))}


class Worker:
    """One direction, on a child key that reads its own records only and aggregate results only."""

    def __init__(self, dag: "Dag", key: dict[str, Any], direction: dict[str, Any], label: str, parents: list[str],
                 start_model: str):
        self.dag, self.key, self.direction, self.label, self.parents = dag, key, direction, label, parents
        self.start_model = start_model

    def call(self, path: str, body: object = None, raw: bytes | None = None) -> dict[str, Any]:
        return B.call(path, body, raw, key=self.key["key"])

    def run(self) -> dict[str, Any]:
        d, args = self.direction, self.dag.args
        exp = self.call("/records/v1/experiments", {"name": f"{self.label} {d['name']}", "parents": self.parents})["id"]
        self.call("/records/v1/annotations", {"kind": "hypothesis", "experiment_ids": [exp],
                                              "statement": f"{d['name']} lifts {self.dag.benchmark} dev accuracy",
                                              "rationale": json.dumps(d)})
        say("worker", {"key": self.key["id"], "experiment": exp, "direction": d})
        model = self.start_model
        if d["rows"] and self.dag.can("training") and self.dag.teacher:
            rows = self.generate(d["rows"])
            model = self.train(rows, d["steps"], exp) or model
        harness = (self.variant(d["harness"], d["samples"]) if d["harness"] in ("vote", "retry")
                   else self.dag.start_harness)
        body = {"benchmark": self.dag.benchmark, "split": "dev", "model": model, "harness": harness or "minimal",
                "attempts": 1, "experiment": exp, "limit": args.limit,
                "sampling": {"temperature": 0.7 if d["harness"] == "vote" else 0, "max_tokens": args.max_tokens}}
        job = self.call("/evaluation/v1/jobs", body)
        while job["status"] not in B.FINAL_EVAL:
            self.dag.sleep()
            job = self.call(f"/evaluation/v1/jobs/{job['id']}")
        score = job.get("score") if job["status"] == "succeeded" else None
        claim = (f"{d['name']}: {model} with {body['harness']} scores {score:.3f} on {self.dag.benchmark} dev"
                 if score is not None else f"{d['name']}: the evaluation {job['status']}")
        finding = self.call("/records/v1/annotations", {"kind": "finding", "claim": claim, "experiment_ids": [exp],
                                                        "metric": f"{self.dag.benchmark}/dev", "value": score})
        result = {"experiment": exp, "finding": finding["id"], "score": score, "model": model,
                  "harness": body["harness"], "job": job["id"], "direction": d, "key_id": self.key["id"]}
        say("worker_done", result)
        return result

    def generate(self, n: int) -> list[dict[str, Any]]:
        """``n`` questions of the benchmark's training pool (disjoint from every task, so the audit
        does not flag the data), answered by the teacher."""
        try:
            pool = B.call_bytes(f"/evaluation/v1/benchmarks/{self.dag.benchmark}/training-pool",
                                key=self.key["key"]).decode()
        except B.Refused as err:
            say("skipped", {"worker": self.key["id"], "step": "teacher data", "reason": str(err)})
            return []
        prompts = [json.loads(line)["question"] for line in pool.splitlines() if line.strip()][:n]

        def ask(prompt: str) -> dict[str, Any] | None:
            reply = self.call("/rollout/v1/chat/completions", {"model": self.dag.teacher, "max_tokens": 8,
                                                               "temperature": 0,
                                                               "messages": [{"role": "user", "content": prompt}]})
            answer = (reply["choices"][0]["message"].get("content") or "").strip()
            return ({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                     "tools": B.HARNESS_TOOLS} if re.fullmatch(r"-?\d+", answer) else None)

        with ThreadPoolExecutor(4) as pool:
            return [r for r in pool.map(ask, prompts) if r is not None]

    def train(self, rows: list[dict[str, Any]], steps: int, exp: str) -> str | None:
        if not rows:
            return None
        fixed = self.dag.rules["fixed"].get("training", {})
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        dataset = self.call("/training/v1/datasets?name=dag-teacher-data", raw=data)["id"]
        start = self.dag.initial_checkpoint
        mine = {**({"parent_checkpoint": start} if start else {"base_model": self.dag.base}), "steps": steps,
                "learning_rate": self.dag.args.lr, "batch_size": 16,
                "max_length": 64, "seed": 1 if self.dag.args.seed is None else self.dag.args.seed,
                "schedule": "linear", "checkpoint_every": steps}
        settings = {k: v for k, v in mine.items() if k not in fixed and not (k == "checkpoint_every" and "steps" in fixed)}
        job = self.call("/training/v1/jobs", {"datasets": [dataset], "experiment": exp, **settings})
        while job["status"] not in B.FINAL_TRAIN:
            self.dag.sleep()
            job = self.call(f"/training/v1/jobs/{job['id']}")
        say("trained", {"worker": self.key["id"], "job": job["id"], "status": job["status"]})
        return (job.get("checkpoints") or [None])[-1]

    def variant(self, mode: str, samples: int) -> str | None:
        if "harness" in self.dag.rules["fixed"].get("evaluation", {}):
            return None
        source = next((Path(d) for d in B.HARNESS_DIRS if Path(d, "harness.toml").is_file()), None)
        if source is None:
            return None
        import io
        import tarfile

        conf = {"mode": mode, "samples": samples, "resample": {"temperature": 0.7}}
        files = {"harness.toml": f'[harness]\nname = "dag-{mode}{samples}"\nrun = "/usr/bin/python3 /harness/variant.py"\n',
                 "minimal_agent.py": (source / "minimal_agent.py").read_text(), "variant.py": B.VARIANT_PY,
                 "variant.json": json.dumps(conf)}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in sorted(files):
                blob = files[path].encode()
                info = tarfile.TarInfo(path)
                info.size, info.mode = len(blob), 0o644
                tar.addfile(info, io.BytesIO(blob))
        return str(self.call("/evaluation/v1/harnesses", raw=buf.getvalue())["id"])


class Dag:
    def __init__(self, rules: dict[str, Any], args: argparse.Namespace):
        self.rules, self.args = rules, args
        self.granted = set(rules["granted"])
        self.benchmark = (rules["benchmarks"] or ["arithmetic"])[0]
        self.me = B.call("/v1/key")
        bases = [m["id"] for m in B.call("/inference/v1/models")["data"] if m.get("kind") == "base"]
        listed = rules["models"].get("evaluation") or rules["models"].get("training")
        self.base = listed[0] if listed else bases[0]
        initial = self.me.get("initial_system")  # a run started from an earlier generation (--from)
        self.initial_checkpoint: str | None = None
        self.start_harness = "minimal"
        if initial is not None:
            self.base, self.start_harness = str(initial["model"]), str(initial["harness"])
            if initial.get("weights_hash"):  # a checkpoint: Workers train from it
                self.initial_checkpoint = str(initial["model"])
        self.teacher = self._teacher()
        self.model = args.model or _first_agent_model()
        self._stop = threading.Event()

    def can(self, service: str) -> bool:
        return service in self.granted

    def sleep(self) -> None:
        self._stop.wait(self.args.poll)

    def _teacher(self) -> str | None:
        named = self.rules["models"].get("rollout")
        if not self.can("rollout") or named == []:
            return None
        listed = [m["id"] for m in B.call("/rollout/v1/models")["data"] if named is None or m["id"] in named]
        return "teacher" if "teacher" in listed else (listed[0] if listed else None)

    # -- thinking (the agent-model route) -----------------------------------------------------

    def think(self, role: str, content: dict[str, Any]) -> dict[str, Any]:
        """The model's JSON answer for ``role``; when it answers none (a small model, e.g. one the
        gym trained and serves as this agent's model), the role's fallback, said aloud and written
        into the decision's rationale: the plan tries every option, a review states that the
        reviewer model gave none, a decision stops."""
        reply = B.call("/agent/v1/chat/completions", {
            "model": self.model, "temperature": 0,
            "max_tokens": min(self.args.think_tokens, self.args.token_cap or self.args.think_tokens),
            "messages": [{"role": "system", "content": PROMPTS[role]},
                         {"role": "user", "content": json.dumps(content)}]})
        text = reply["choices"][0]["message"].get("content") or ""
        try:
            answer = _json_object(text)
        except B.Refused as err:
            answer = self.fallback(role, content, str(err))
            say("thought", {"role": role, "fallback": True, "answer": answer, "model_said": text[:200]})
            return answer
        say("thought", {"role": role, "answer": answer})
        return answer

    @staticmethod
    def fallback(role: str, content: dict[str, Any], why: str) -> dict[str, Any]:
        note = f"fallback ({why[:300]})"
        if role == "main-plan":
            return {"directions": content.get("options") or [], "rationale": f"{note}: every option the track allows"}
        if role == "reviewer":
            return {"uncertainties": [f"{note}: the reviewer model wrote no review; the findings stand unreviewed"]}
        return {"action": "stop", "rationale": f"{note}: stop and submit the best unflagged system"}

    # -- the records: the research graph ------------------------------------------------------

    def graph(self) -> dict[str, Any]:
        experiments = B.call("/records/v1/experiments")["data"]
        annotations = B.call("/records/v1/annotations")["data"]
        return {"experiments": experiments,
                "decisions": [a for a in annotations if a["kind"] == "decision" and a["key_id"] == self.me["id"]],
                "findings": [a for a in annotations if a["kind"] == "finding"],
                "reviews": [a for a in annotations if a["kind"] == "review"]}

    def decide(self, action: str, rationale: str, experiments: list[str], directions: list[dict[str, Any]],
               reacts_to: list[str]) -> dict[str, Any]:
        decision = B.call("/records/v1/annotations", {
            "kind": "decision", "action": action, "rationale": rationale[:4000], "experiment_ids": experiments,
            "directions": [json.dumps(d) for d in directions], "reacts_to": reacts_to})
        say("decision", {"id": decision["id"], "action": action, "directions": directions, "reacts_to": reacts_to})
        return decision

    def options(self) -> list[dict[str, Any]]:
        free_harness = self.can("evaluation") and "harness" not in self.rules["fixed"].get("evaluation", {})
        found = []
        if self.can("training") and self.teacher:
            found.append({"name": "teacher-data", "rows": self.args.rows, "steps": self.args.steps, "harness": "minimal"})
        if free_harness:
            found += [{"name": "harness-vote", "rows": 0, "harness": "vote", "samples": 3},
                      {"name": "harness-retry", "rows": 0, "harness": "retry", "samples": 2}]
        return found

    # -- one round: workers in parallel, a review over them, a decision ------------------------

    def mint(self, name: str, services: dict[str, Any]) -> dict[str, Any]:
        policy = json.loads(json.dumps(self.me["policy"]))
        for service, rules in services.items():
            if service in policy.get("services", {}):
                policy["services"][service].update(rules)
        child = B.call("/v1/keys", {"name": name, "policy": policy})
        return {"id": child["id"], "key": child["key"]}

    def workers(self, decision: dict[str, Any], graph: dict[str, Any]) -> list[dict[str, Any]]:
        """The decision's directions, each done by a Worker (those already done are read back)."""
        directions = [_direction(json.loads(d)) for d in decision.get("directions", [])]
        parents = list(decision.get("experiment_ids") or [])
        start = self.start_model(graph, parents)
        results: list[dict[str, Any] | None] = []
        todo = []
        # A Worker reads its own records, plus those of the experiments it continues (a later round's),
        # never a sibling's of the same round.
        owners = sorted({e["owner_key_id"] for e in graph["experiments"] if e["id"] in parents})
        limits: dict[str, Any] = {"evaluation": {"detail": "aggregate"}}
        if owners:
            limits["records"] = {"owners": owners}
        for i, d in enumerate(directions):
            label = f"{decision['id']}#{i}"
            done = self.done(graph, label)
            results.append(done)
            if done is None:
                key = self.mint(f"worker-{label}", limits)
                todo.append((i, Worker(self, key, d, label, parents, start)))
            else:
                say("worker_done", {**done, "resumed": True})
        with ThreadPoolExecutor(max(1, len(todo))) as pool:
            for (i, _), result in zip(todo, pool.map(lambda t: t[1].run(), todo), strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def done(self, graph: dict[str, Any], label: str) -> dict[str, Any] | None:
        """The direction's finished work, if a Worker finished it (one cut short left an experiment
        without a finding: it is run again, on a fresh key and experiment)."""
        for exp in (e for e in graph["experiments"] if e["name"].startswith(label + " ")):
            finding = next((f for f in graph["findings"] if exp["id"] in f["experiment_ids"]), None)
            if finding is not None:
                return {"experiment": exp["id"], "finding": finding["id"], "score": finding.get("value"),
                        "key_id": exp["owner_key_id"], "model": self.model_of(exp), "direction": {"name": exp["name"]}}
        return None

    @staticmethod
    def model_of(exp: dict[str, Any]) -> str | None:
        """The checkpoint the experiment trained, else the model it evaluated (its node view)."""
        checkpoints = (exp.get("theta_out") or {}).get("checkpoints") or []
        evaluated = [v["model"] for v in exp.get("evaluations") or [] if v.get("model")]
        return checkpoints[-1] if checkpoints else (evaluated[-1] if evaluated else None)

    @staticmethod
    def harness_of(exp: dict[str, Any]) -> str:
        evaluated = [v["harness"] for v in exp.get("evaluations") or [] if v.get("harness")]
        return evaluated[-1] if evaluated else "minimal"

    def start_model(self, graph: dict[str, Any], parents: list[str]) -> str:
        """The best checkpoint among the continued experiments' findings, else the base."""
        scored = [(f.get("value") or 0, e) for e in graph["experiments"] if e["id"] in parents
                  for f in graph["findings"] if e["id"] in f["experiment_ids"]]
        for _, exp in sorted(scored, key=lambda t: -t[0]):
            model = self.model_of(exp)
            if model and model.startswith("ckpt_"):
                return model
        return self.base

    def review(self, results: list[dict[str, Any]], graph: dict[str, Any]) -> dict[str, Any]:
        experiments = [r["experiment"] for r in results]
        written = next((r for r in graph["reviews"] if set(experiments) <= set(r["experiment_ids"])), None)
        if written is not None:
            say("review", {"id": written["id"], "resumed": True})
            return written
        owners = sorted({r["key_id"] for r in results})
        reviewer = self.mint(f"reviewer-{'-'.join(e[-6:] for e in experiments)}", {"records": {"owners": owners}})
        read = lambda path: B.call(path, key=reviewer["key"])  # noqa: E731 - the reviewer's own eyes
        evidence: dict[str, Any] = {"experiments": [], "benchmark": self.benchmark}
        for r in results:
            exp = read(f"/records/v1/experiments/{r['experiment']}")
            findings = read(f"/records/v1/annotations?kind=finding&experiment={r['experiment']}")["data"]
            item: dict[str, Any] = {"id": exp["id"], "name": exp["name"], "parents": exp["parents"],
                                    "findings": [{"claim": f["claim"], "value": f.get("value")} for f in findings]}
            model = self.model_of(exp)
            if model and model.startswith("ckpt_"):
                item["lineage"] = read(f"/records/v1/checkpoints/{model}/lineage")
            for action in (a for a in exp.get("action") or [] if a.get("kind") == "training"):
                job = read(f"/training/v1/jobs/{action['job_id']}")  # the settings it trained with
                item.setdefault("training", []).append({"job": job["id"], "config": job.get("config"),
                                                        "status": job.get("status")})
                for dataset in action.get("datasets") or []:  # a sample of the data, read as it is
                    rows = self.sample(reviewer["key"], dataset["id"])
                    item.setdefault("data_samples", []).append({"dataset": dataset["id"], "rows": rows})
            if r.get("job"):
                results_page = read(f"/evaluation/v1/jobs/{r['job']}/results")
                item["trials"] = [{"task": t.get("task_id"), "reward": t.get("reward"), "error": t.get("error")}
                                  for t in results_page.get("data", [])[:10]]
            evidence["experiments"].append(item)
        answer = self.think("reviewer", evidence)
        points = {k: [str(p)[:4000] for p in answer.get(k) or []][:100]
                  for k in ("findings_supported", "uncertainties", "missing_comparisons", "suggested_next_experiments",
                            "regressions")}
        review = B.call("/records/v1/annotations", {"kind": "review", "experiment_ids": experiments, **points},
                        key=reviewer["key"])
        say("review", {"id": review["id"], "reviewer": reviewer["id"], "experiments": experiments})
        return review

    @staticmethod
    def sample(key: str, dataset_id: str, rows: int = 3) -> list[Any]:
        """The first rows of a dataset (JSONL), as a reviewer reads them."""
        import urllib.request

        request = urllib.request.Request(f"{os.environ['RSIGYM_URL']}/training/v1/datasets/{dataset_id}/content",
                                         headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                lines = response.read(64 * 1024).decode(errors="replace").splitlines()[:rows]
        except OSError as err:
            return [f"unreadable: {type(err).__name__}"]
        return [_row(line) for line in lines]

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        graph = self.graph()
        if not graph["decisions"]:  # the plan: the graph's first decision, continuing nothing
            plan = self.think("main-plan", {"options": self.options(), "benchmark": self.benchmark,
                                            "track": self.rules["track"]})
            directions = [_direction(d) for d in plan.get("directions") or []]
            self.decide("branch", str(plan.get("rationale") or "initial plan"), [], directions, [])
            graph = self.graph()
        for _ in range(self.args.max_rounds + 1):
            last = graph["decisions"][-1]
            if last["action"] == "stop":
                return self.submit(graph)
            round_no = len(graph["decisions"])
            if self.args.stop_after_rounds and round_no > self.args.stop_after_rounds:
                say("paused", {"round": round_no})
                return 3
            results = self.workers(last, graph)
            graph = self.graph()
            review = self.review(results, graph)
            answer = self.think("main-decide", {
                "round": round_no, "max_rounds": self.args.max_rounds, "review": {
                    k: review.get(k) for k in ("findings_supported", "uncertainties", "missing_comparisons",
                                               "suggested_next_experiments")},
                "results": [{"experiment": r["experiment"], "direction": r["direction"], "score": r["score"]}
                            for r in results]})
            said = str(answer.get("action"))
            action = said if said in ("continue", "verify", "branch", "revise") else "stop"
            directions = [_direction(d) for d in answer.get("directions") or []] if action != "stop" else []
            if not directions:  # nothing to go on with is a stop, whatever the word
                action = "stop"
            self.decide(action, str(answer.get("rationale") or action),
                        [r["experiment"] for r in results], directions,
                        [review["id"], *(r["finding"] for r in results)])
            graph = self.graph()
        return self.submit(graph)

    def submit(self, graph: dict[str, Any]) -> int:
        """The best dev system the records do not flag that holds what the track's submission
        needs (a checkpoint: one the run trained), and exactly those artifacts."""
        needs = self.rules["needs"] or ["checkpoint"]
        best: tuple[float, dict[str, Any]] | None = None
        for exp in graph["experiments"]:
            model = self.model_of(exp)
            if exp["status"] == "flagged" or ("checkpoint" in needs and not (model or "").startswith("ckpt_")):
                continue
            for f in graph["findings"]:
                if exp["id"] in f["experiment_ids"] and f.get("value") is not None and (best is None or f["value"] > best[0]):
                    best = (f["value"], exp)
        if best is None:
            say("submitted", None)
            return 1
        artifacts = {"checkpoint": self.model_of(best[1]), "harness": self.harness_of(best[1])}
        body = {part: artifacts[part] for part in needs}
        submission = B.call("/evaluation/v1/submissions", body)
        say("submitted", {"id": submission["id"], "body": body, "experiment": best[1]["id"], "score": best[0]})
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="the agent-route model to think with (default: the first)")
    parser.add_argument("--max-rounds", type=int, default=2, help="decisions after the plan before it stops")
    parser.add_argument("--stop-after-rounds", type=int, default=0, help="exit (3) before this round: a restart test")
    parser.add_argument("--limit", type=int, default=10, help="dev tasks per evaluation")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=6e-3)
    parser.add_argument("--think-tokens", type=int, default=800)
    parser.add_argument("--token-cap", type=int, default=0, help="the most max_tokens the agent route grants the "
                        "model (0: no cap known); --think-tokens is held under it")
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None, help="the Workers' training seed (default 1)")
    args = parser.parse_args()
    rules = B.read_track(Path(os.environ["RSIGYM_INSTRUCTION"]).read_text())
    say("rules", rules)
    try:
        return Dag(rules, args).run()
    except B.Refused as err:
        say("error", str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
