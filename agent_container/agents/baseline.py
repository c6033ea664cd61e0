"""The scripted baseline research agent (no LLM): the embedded demo's agent and the reference a
research agent should beat. Standard library only, so it runs unchanged under the host's system
python inside the launcher's namespaces (where the SDK's httpx is absent) and in the agent image.

It learns what its run allows from the rendered instruction (``$RSIGYM_INSTRUCTION``: the gym
renders it from the run key's effective policy: track, granted and revoked services, models,
fixed settings, submission artifacts, budget, wall clock) and its initial system from its key. Then:

1. measures the initial system on ``dev``: the base / instruct model with the minimal harness, or —
   a run started from an earlier generation (``GET /v1/key``'s ``initial_system``) — that
   generation's accepted checkpoint and harness, which it then trains from (``parent_checkpoint``);
2. rollout granted with a teacher: asks the teacher to answer questions of the benchmark's training
   pool (never questions it makes up: in a small task space those hit hidden tasks);
3. training granted: trains (its own small settings, minus every setting the track fixes) and
   evaluates the checkpoint;
4. harness free (evaluation granted, harness not fixed): builds variants of the minimal harness
   (self-consistency voting over N samples; a retry when the answer fails an integer check) as
   archives, uploads and evaluates them;
5. writes each hypothesis and finding to the records, picks the best ``accepted`` dev system that
   holds what the submission needs, and submits exactly those artifacts.

It stops starting work when the budget left or the wall clock runs low. Every line it prints is
``name: <json>`` (for tests and ``rsigym run logs``)."""

import argparse
import io
import json
import os
import random
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HARNESS_DIRS = ("/opt/rsigym/harness/minimal", str(Path(__file__).resolve().parents[1] / "harness" / "minimal"))
"""Where the minimal harness's source is: bound there by the launcher and the agent image; the repo."""
HARNESS_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
                 for n in ("bash", "read_file", "write_file", "finish")]
"""The minimal harness's tools (the chat template renders their names): rows in the harness's prompt shape."""
FINAL_EVAL, FINAL_TRAIN = ("succeeded", "failed", "cancelled"), ("succeeded", "failed", "cancelled", "budget_exhausted")

VARIANT_PY = '''"""A variant of the minimal harness (built by the baseline agent): runs minimal_agent.main up to
N times and answers with the majority integer answer (vote) or the first that passes the check (retry)."""
import collections, json, os, re, shutil, signal, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import minimal_agent
CONF = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "variant.json")))
def check(text):
    found = re.findall(r"-?\\d+", text or "")
    return found[-1] if found else None
def main():
    env, meta = dict(os.environ), json.loads(os.environ.get("RSIGYM_TASK_METADATA") or "{}")
    sampling = json.loads(os.environ.get("RSIGYM_SAMPLING") or "{}")
    trajectory = env.get("RSIGYM_TRAJECTORY_FILE", "/logs/agent/trajectory.json")
    answers, code = [], 0
    for i in range(CONF["samples"]):
        where = "/tmp/variant-%d" % i
        os.makedirs(where, exist_ok=True)
        s = dict(sampling, **(CONF["resample"] if i and CONF["mode"] == "retry" else {}))
        if CONF["mode"] == "vote" or i:
            s["seed"] = int(s.get("seed") or 0) + i
        run_env = dict(env, RSIGYM_SAMPLING=json.dumps(s), RSIGYM_TRAJECTORY_FILE=where + "/trajectory.json")
        if meta.get("answer_file"):
            run_env["RSIGYM_TASK_METADATA"] = json.dumps(dict(meta, answer_file=where + "/answer.txt"))
        code = minimal_agent.main(run_env)
        try:
            answers.append(check(open(where + "/answer.txt").read()))
        except OSError:
            answers.append(None)
        if CONF["mode"] == "retry" and answers[-1] is not None:
            break
    valid = [a for a in answers if a is not None]
    chosen = collections.Counter(valid).most_common(1)[0][0] if valid else None
    pick = answers.index(chosen) if chosen is not None else len(answers) - 1
    os.makedirs(os.path.dirname(trajectory), exist_ok=True)
    shutil.copyfile("/tmp/variant-%d/trajectory.json" % pick, trajectory)
    if chosen is not None and meta.get("answer_file"):
        os.makedirs(os.path.dirname(meta["answer_file"]), exist_ok=True)
        open(meta["answer_file"], "w").write(chosen)
    print(json.dumps({"variant": CONF["mode"], "answers": answers, "chosen": chosen}), flush=True)
    return 0 if chosen is not None else code
if __name__ == "__main__":
    signal.signal(signal.SIGTERM, minimal_agent._on_sigterm)
    sys.exit(main())
'''


def say(name: str, value: object) -> None:
    print(f"{name}: {json.dumps(value)}", flush=True)


class Refused(Exception):
    """A call the gym refused (its standard error body) or that did not reach it."""


def call(path: str, body: object = None, raw: bytes | None = None, key: str | None = None) -> dict[str, Any]:
    """A gym call with the run key (or ``key``: a child key's)."""
    return json.loads(call_bytes(path, body, raw, key))


def call_bytes(path: str, body: object = None, raw: bytes | None = None, key: str | None = None) -> bytes:
    """:func:`call`'s response body, unparsed (JSONL downloads)."""
    headers = {"Authorization": "Bearer " + (key or os.environ["RSIGYM_API_KEY"])}
    data = raw
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(os.environ["RSIGYM_URL"] + path, data=data, headers=headers)
    for attempt in range(5):
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")[:500]
            if err.code == 429 and attempt < 4:  # a rate or concurrency limit: wait as told
                time.sleep(float(err.headers.get("Retry-After") or 2))
                continue
            raise Refused(f"{err.code} {path}: {text}") from None
        except OSError as err:
            raise Refused(f"{path}: {type(err).__name__}: {err}") from None
    raise AssertionError("unreachable")


# -- what the run allows: read from the instruction the gym rendered from the key's policy ------------

def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", text)))


def read_track(text: str) -> dict[str, Any]:
    """The track's rules as the instruction states them (tasks/_shared/rules.md.j2)."""
    track = re.search(r"Track: \*\*([\w+]+)\*\*", text)
    granted = re.search(r"Granted services:\n((?:- \*\*\w+\*\*.*\n?)+)", text)
    needs = re.search(r"must contain: (.+?)\.\n", text)
    models = {s: re.findall(r"`([^`]+)`", line) for s, line in re.findall(r"^- (\w+) models: (.*)$", text, re.M)}
    fixed: dict[str, Any] = {}
    for service, block in re.findall(r"^- Fixed (\w+) settings.*\n((?:  - `.*\n?)+)", text, re.M):
        fixed[service] = {p: json.loads(v) for p, v in re.findall(r"`([^`]+)` = `(.*)`", block)}
    budget = re.search(r"Service budget: \*\*([\d.]+) USD\*\*", text)
    wall = re.search(r"Wall clock: \*\*([^*]+)\*\*", text)
    benchmarks = re.search(r"Benchmarks: (.*?) \(the `dev` split", text)
    return {"track": track.group(1) if track else None,
            "granted": re.findall(r"^- \*\*(\w+)\*\*", granted.group(1), re.M) if granted else [],
            "benchmarks": re.findall(r"`([\w.-]+)`", benchmarks.group(1)) if benchmarks else [],
            "models": models, "fixed": fixed, "needs": re.findall(r"\*\*(\w+)\*\*", needs.group(1)) if needs else [],
            "budget_usd": float(budget.group(1)) if budget else None,
            "wall_clock_s": _duration(wall.group(1)) if wall else None}


# -- the agent ----------------------------------------------------------------------------------------

class Baseline:
    def __init__(self, rules: dict[str, Any], args: argparse.Namespace):
        self.rules, self.args, self.started = rules, args, time.monotonic()
        self.granted = set(rules["granted"])
        self.benchmark = (rules["benchmarks"] or ["arithmetic"])[0]
        self.systems: list[dict[str, Any]] = []
        self.eval_cost = 0.0
        self.bases = {m["id"]: m for m in call("/inference/v1/models")["data"] if m.get("kind") == "base"}
        self.initial = call("/v1/key").get("initial_system")
        """The system this run starts from (``rsigym run start --from``: an earlier generation's accepted
        submission, its checkpoint and harness), or None: the base model with the minimal harness."""

    # budget and clock
    def remaining(self) -> float:
        return float(call("/v1/balance")["remaining_usd"])

    def can_afford(self, what: str, estimate: float) -> bool:
        """Enough budget for ``estimate`` beyond the reserve, and time before the wall clock."""
        left, wall = self.remaining(), self.rules["wall_clock_s"]
        reserve = self.args.reserve * (self.rules["budget_usd"] or left)
        late = wall is not None and time.monotonic() - self.started > self.args.time_share * wall
        if left - estimate < reserve or late:
            say("skipped", {"step": what, "remaining_usd": left, "estimate_usd": estimate, "late": late})
            return False
        return True

    def fixed(self, service: str) -> dict[str, Any]:
        return self.rules["fixed"].get(service, {})

    # records
    def experiment(self, name: str, parents: list[str], hypothesis: str) -> str:
        exp = call("/records/v1/experiments", {"name": name, "parents": parents})["id"]
        call("/records/v1/annotations", {"kind": "hypothesis", "statement": hypothesis, "experiment_ids": [exp]})
        say("experiment", {"id": exp, "name": name, "hypothesis": hypothesis})
        return exp

    def finding(self, exp: str, claim: str, score: float) -> None:
        call("/records/v1/annotations", {"kind": "finding", "claim": claim, "experiment_ids": [exp],
                                         "metric": f"{self.benchmark}/dev", "value": score})

    # evaluation
    def evaluate(self, model: str, harness: str, exp: str, label: str, sampling: dict[str, Any] | None = None,
                 runs: int = 1) -> dict[str, Any] | None:
        """A dev evaluation; ``runs``: model runs per trial (a variant's samples), for the budget check."""
        if not self.can_afford(f"evaluate {label}", self.eval_cost * runs):
            return None
        before = self.remaining()
        body = {"benchmark": self.benchmark, "split": "dev", "model": model, "harness": harness,
                "attempts": self.args.attempts, "experiment": exp,
                "sampling": sampling or {"temperature": 0, "max_tokens": self.args.max_tokens}}
        if self.args.limit:
            body["limit"] = self.args.limit
        job = call("/evaluation/v1/jobs", body)
        while job["status"] not in FINAL_EVAL:
            time.sleep(self.args.poll)
            job = call(f"/evaluation/v1/jobs/{job['id']}")
        self.eval_cost = max(self.eval_cost, (before - self.remaining()) / runs)
        system = {"label": label, "model": model, "harness": harness, "experiment": exp, "job": job["id"],
                  "status": job["status"], "score": job.get("score")}
        say("evaluation", system)
        if job["status"] == "succeeded" and job.get("score") is not None:
            self.systems.append(system)
            self.finding(exp, f"{label} scores {job['score']:.3f} on {self.benchmark} dev", float(job["score"]))
            return system
        return None

    def initial_model(self) -> str:
        if self.initial is not None:
            return str(self.initial["model"])
        listed = self.rules["models"].get("evaluation") or self.rules["models"].get("training")
        return listed[0] if listed else next(iter(self.bases))

    def initial_harness(self) -> str:
        return str(self.initial["harness"]) if self.initial is not None else "minimal"

    def base_of(self, model: str) -> str:
        """The base model under ``model`` (a checkpoint's is the initial system's base)."""
        return str(self.initial["base_model"]) if model.startswith("ckpt_") and self.initial else model

    # data and training
    def teacher(self) -> dict[str, Any] | None:
        """The teacher to generate data with (its /rollout/v1/models entry), if the track has one."""
        named = self.rules["models"].get("rollout")
        if "rollout" not in self.granted or named == []:
            return None
        listed = [m for m in call("/rollout/v1/models")["data"] if named is None or m["id"] in named]
        return next((m for m in listed if m["id"] == "teacher"), listed[0] if listed else None)

    def pool(self) -> list[str]:
        """The benchmark's training pool: questions of its form that no task asks. Questions drawn
        from the task space itself would hit hidden tasks by chance (the arithmetic benchmark has
        4,005 possible questions), and the audit rightly flags training on them."""
        try:
            text = call_bytes(f"/evaluation/v1/benchmarks/{self.benchmark}/training-pool").decode()
        except Refused as err:
            say("skipped", {"step": "teacher data", "reason": f"no training pool to draw questions from: {err}"})
            return []
        return [json.loads(line)["question"] for line in text.splitlines() if line.strip()]

    def generate(self, teacher: str) -> list[dict[str, Any]]:
        """Questions from the benchmark's training pool, answered by the teacher."""
        rng = random.Random(7 if self.args.seed is None else self.args.seed)
        prompts = self.pool()
        rng.shuffle(prompts)
        prompts = prompts[: self.args.rows]
        if not prompts:
            return []

        def ask(prompt: str) -> dict[str, Any] | None:
            try:
                reply = call("/rollout/v1/chat/completions", {"model": teacher, "max_tokens": 8, "temperature": 0,
                                                               "messages": [{"role": "user", "content": prompt}]})
            except Refused as err:
                say("rollout_error", str(err))
                return None
            answer = (reply["choices"][0]["message"].get("content") or "").strip()
            if not re.fullmatch(r"-?\d+", answer):  # keep only answers that pass the check
                return None
            return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                    "tools": HARNESS_TOOLS}

        with ThreadPoolExecutor(8) as pool:
            rows = [r for r in pool.map(ask, prompts) if r is not None]
        say("generated", {"teacher": teacher, "asked": len(prompts), "rows": len(rows)})
        return rows

    def train(self, rows: list[dict[str, Any]], exp: str, base: str) -> str | None:
        fixed = self.fixed("training")
        start = {"parent_checkpoint": base} if base.startswith("ckpt_") else {"base_model": base}
        mine = {**start, "steps": self.args.steps, "learning_rate": self.args.lr, "batch_size": 16,
                "max_length": 64, "seed": 1 if self.args.seed is None else self.args.seed, "schedule": "linear",
                "checkpoint_every": self.args.steps}
        steps = fixed.get("steps", mine["steps"])
        price = self.bases[self.base_of(base)]["pricing"]["train_usd_per_mtok"]
        estimate = steps * fixed.get("batch_size", 16) * fixed.get("max_length", 64) * price / 1e6
        if not self.can_afford("train", estimate):
            return None
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        dataset = call("/training/v1/datasets?name=teacher-subtraction", raw=data)["id"]
        settings = {k: v for k, v in mine.items() if k not in fixed and not (k == "checkpoint_every" and "steps" in fixed)}
        job = call("/training/v1/jobs", {"datasets": [dataset], "experiment": exp, **settings})
        say("training", {"job": job["id"], "dataset": dataset, "settings": settings})
        while job["status"] not in FINAL_TRAIN:
            time.sleep(self.args.poll)
            job = call(f"/training/v1/jobs/{job['id']}")
        say("trained", {"job": job["id"], "status": job["status"], "checkpoints": job.get("checkpoints")})
        return (job.get("checkpoints") or [None])[-1]

    # harness variants
    def variant(self, mode: str, samples: int) -> str | None:
        source = next((Path(d) for d in [self.args.harness_dir, *HARNESS_DIRS] if d and Path(d, "harness.toml").is_file()), None)
        if source is None:
            say("skipped", {"step": f"harness {mode}", "reason": "the minimal harness's source is not here"})
            return None
        name = f"baseline-{mode}{samples}"
        conf = {"mode": mode, "samples": samples, "resample": {"temperature": 0.7}}
        files = {"harness.toml": f'[harness]\nname = "{name}"\nrun = "/usr/bin/python3 /harness/variant.py"\n',
                 "minimal_agent.py": (source / "minimal_agent.py").read_text(), "variant.py": VARIANT_PY,
                 "variant.json": json.dumps(conf)}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:  # deterministic: sorted, mtime 0, owner 0
            for path in sorted(files):
                blob = files[path].encode()
                info = tarfile.TarInfo(path)
                info.size, info.mode = len(blob), 0o644
                tar.addfile(info, io.BytesIO(blob))
        harness = call("/evaluation/v1/harnesses", raw=buf.getvalue())["id"]
        say("harness", {"id": harness, "name": name, **conf})
        return harness

    # the plan
    def run(self) -> int:
        rules = self.rules
        base, start_harness = self.initial_model(), self.initial_harness()
        root = self.experiment("initial system", [], f"{base} with the {start_harness} harness is the reference on dev")
        best = self.evaluate(base, start_harness, root, f"{base} + {start_harness}")
        teacher = self.teacher() if "training" in self.granted else None
        price = teacher["pricing"] if teacher else {}
        rollout_usd = self.args.rows * (64 * price.get("input_usd_per_mtok", 0) + 8 * price.get("output_usd_per_mtok", 0)) / 1e6
        if teacher and self.can_afford("rollout", rollout_usd):
            exp = self.experiment("teacher data", [root], f"training {base} on {self.args.rows} training-pool questions answered "
                                  f"by {teacher['id']} lifts dev accuracy")
            rows = self.generate(teacher["id"])
            checkpoint = self.train(rows, exp, base) if rows else None
            if checkpoint:
                for harness in dict.fromkeys(("minimal", start_harness)):  # the start's harness too
                    self.evaluate(checkpoint, harness, exp, f"{checkpoint} + {harness}")
        else:
            say("skipped", {"step": "train", "granted": sorted(self.granted), "teacher": teacher and teacher["id"]})
        needs_checkpoint = "checkpoint" in rules["needs"]
        pool = [s for s in self.systems if not needs_checkpoint or s["model"].startswith("ckpt_")]
        best = max(pool, key=lambda s: s["score"], default=best)
        if "evaluation" in self.granted and "harness" not in self.fixed("evaluation") and best is not None:
            for mode, samples, temperature in (("vote", self.args.votes, 0.7), ("retry", 3, 0.0)):
                exp = self.experiment(f"harness {mode}", [best["experiment"]],
                                      f"{mode} over up to {samples} runs of the minimal harness beats it")
                harness = self.variant(mode, samples)
                if harness:
                    self.evaluate(best["model"], harness, exp, f"{best['model']} + {mode}{samples}",
                                  {"temperature": temperature, "max_tokens": self.args.max_tokens}, runs=samples)
        else:
            say("skipped", {"step": "harness variants", "fixed": self.fixed("evaluation")})
        return self.submit(needs_checkpoint)

    def submit(self, needs_checkpoint: bool) -> int:
        """Submit the best dev system the records do not flag (``pending`` until an audit, then
        ``accepted`` or ``flagged``) that holds what the track needs, and exactly those artifacts."""
        accepted = [s for s in self.systems if call(f"/records/v1/experiments/{s['experiment']}")["status"] != "flagged"
                    and (not needs_checkpoint or s["model"].startswith("ckpt_"))]
        if not accepted:
            say("submitted", None)
            return 1
        best = max(accepted, key=lambda s: s["score"])
        body = {part: best["model" if part == "checkpoint" else part] for part in self.rules["needs"]}
        submission = call("/evaluation/v1/submissions", body)
        say("best", best)
        say("submitted", {"id": submission["id"], "body": body})
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="dev tasks per evaluation (0: all)")
    parser.add_argument("--attempts", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rows", type=int, default=3000, help="teacher rows to generate")
    parser.add_argument("--steps", type=int, default=400, help="training steps (where the track leaves them free)")
    parser.add_argument("--lr", type=float, default=6e-3)
    parser.add_argument("--votes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None,
                        help="seeds the teacher-data draw (default 7) and the training jobs (default 1)")
    parser.add_argument("--reserve", type=float, default=0.1, help="share of the budget never spent")
    parser.add_argument("--time-share", type=float, default=0.8, help="share of the wall clock to start work in")
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--harness-dir", default=None)
    args = parser.parse_args()
    rules = read_track(Path(os.environ["RSIGYM_INSTRUCTION"]).read_text())
    say("rules", rules)
    try:
        return Baseline(rules, args).run()
    except Refused as err:
        say("error", str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
