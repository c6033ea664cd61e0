"""``execution_*``: training jobs, inference and rollout chat, evaluation jobs, harnesses,
sandboxes and the run's submission — the actions that spend the budget.

Training meters itself step by step, chat by tokens at catalogue prices, sandboxes by the second;
an evaluation job's trials spend sandbox seconds and tokens like any other use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from pydantic import Field

from .._base_client import APICall
from .._client import Gym
from .._response import ObjectList, parse_list
from ..resources.sandbox import Sandbox
from ..types import TrainingJob
from ._tools import Result, ToolRegistrar, dump

__all__ = ["register"]

JobId = Annotated[str, Field(description="a job id")]
SandboxId = Annotated[str, Field(description="a sandbox id")]
Ids = list[str] | None


def _training_jobs_call() -> APICall[ObjectList[TrainingJob]]:
    """``GET /training/v1/jobs`` (the gateway serves it; the SDK has no method yet)."""
    return APICall("GET", "/training/v1/jobs", parse_list(TrainingJob))


def register(server: MCPServer, gym: Gym) -> None:
    tool = ToolRegistrar(server, "execution")
    _training(tool, gym)
    _chat(tool, gym)
    _evaluation(tool, gym)
    _sandboxes(tool, gym)


def _training(tool: ToolRegistrar, gym: Gym) -> None:
    @tool("start_training", "Start a LoRA training job on datasets from a base model or a checkpoint (metered per "
          "step against the budget; ends budget_exhausted, keeping its last checkpoint, when a step can't be paid).")
    def start_training(
        datasets: Annotated[list[str], Field(description="dataset ids (ds_…)")],
        base_model: Annotated[str | None, Field(description="a base model (or give parent_checkpoint)")] = None,
        parent_checkpoint: Annotated[str | None, Field(description="a checkpoint to continue from")] = None,
        steps: Annotated[int | None, Field(description="optimizer steps (or give epochs)")] = None,
        epochs: Annotated[float | None, Field(description="passes over the data (or give steps)")] = None,
        learning_rate: float | None = None,
        batch_size: int | None = None,
        lora: Annotated[dict[str, Any] | None, Field(description="rank, alpha, dropout, target_modules")] = None,
        experiment: Annotated[str | None, Field(description="one of your experiments to attach the job to")] = None,
        options: Annotated[dict[str, Any] | None, Field(
            description="other job fields: schedule, max_length, seed, loss, custom_loss, checkpoint_every")] = None,
    ) -> Result:
        params = {"datasets": datasets, "base_model": base_model, "parent_checkpoint": parent_checkpoint,
                  "steps": steps, "epochs": epochs, "learning_rate": learning_rate, "batch_size": batch_size,
                  "lora": lora, "experiment": experiment}
        body = dict(options or {})  # the named arguments win over the same field in options
        body.update({name: value for name, value in params.items() if value is not None})
        return dump(gym.training.create_job(**body))

    @tool("training_status", "Show a training job: status, step, cost so far, metrics, checkpoints (free).",
          read_only=True)
    def training_status(job_id: JobId) -> Result:
        return dump(gym.training.get_job(job_id))

    @tool("training_logs", "Read the tail of a training job's log (free).", read_only=True)
    def training_logs(job_id: JobId, lines: Annotated[int, Field(ge=1, le=2000)] = 200) -> Result:
        return {"job_id": job_id, "log": "\n".join(gym.training.logs(job_id).splitlines()[-lines:])}

    @tool("cancel_training", "Cancel a training job; checkpoints already written are kept (free).", destructive=True,
          idempotent=True)
    def cancel_training(job_id: JobId) -> Result:
        return dump(gym.training.cancel_job(job_id))

    @tool("list_training_jobs", "List the run's training jobs with their status (free).", read_only=True)
    def list_training_jobs() -> Result:
        return dump(gym._request(_training_jobs_call()))

    @tool("list_checkpoints", "List the run's checkpoints: job, base model, step, metrics, hashes (free).",
          read_only=True)
    def list_checkpoints() -> Result:
        return dump(gym.training.checkpoints())


def _chat(tool: ToolRegistrar, gym: Gym) -> None:
    @tool("list_models", "List the models of inference (base models, your checkpoints) or rollout (frontier and "
          "teacher models), with prices (free).", read_only=True)
    def list_models(service: Literal["inference", "rollout"] = "inference") -> Result:
        return dump((gym.inference if service == "inference" else gym.rollout).models())

    @tool("chat", "Send one prompt to a base model or checkpoint (inference) or a frontier model (rollout) and "
          "return the reply (metered: tokens at the model's price).")
    def chat(
        model: Annotated[str, Field(description="a model name, or a checkpoint id (ckpt_…) for inference")],
        prompt: str,
        system: str | None = None,
        service: Literal["inference", "rollout"] = "inference",
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> Result:
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": prompt})
        api = gym.inference if service == "inference" else gym.rollout
        reply = api.chat(model=model, messages=messages, max_tokens=max_tokens, temperature=temperature)
        return dump(reply, text=reply.text)


def _evaluation(tool: ToolRegistrar, gym: Gym) -> None:
    @tool("start_evaluation", "Start an evaluation job of a model or checkpoint with a harness on a benchmark split "
          "(default dev); its trials spend sandbox seconds and tokens.")
    def start_evaluation(
        benchmark: str,
        model: Annotated[str, Field(description="a base model or a checkpoint id")],
        split: str = "dev",
        harness: Annotated[str, Field(description="'minimal' or an uploaded harness id")] = "minimal",
        attempts: Annotated[int, Field(ge=1, le=10)] = 1,
        limit: Annotated[int | None, Field(description="only the first N tasks")] = None,
        tasks: Annotated[Ids, Field(description="only these task ids")] = None,
        sampling: Annotated[dict[str, Any] | None, Field(
            description="temperature, top_p, max_tokens, seed")] = None,
        experiment: Annotated[str | None, Field(description="one of your experiments to attach it to")] = None,
    ) -> Result:
        return dump(gym.evaluation.run(benchmark, model, split=split, harness=harness, attempts=attempts,
                                       sampling=sampling, tasks=tasks, limit=limit, experiment=experiment))

    @tool("evaluation_status", "Show an evaluation job: status, progress, score (avg@k) when done (free).",
          read_only=True)
    def evaluation_status(job_id: JobId) -> Result:
        return dump(gym.evaluation.get(job_id))

    @tool("evaluation_results", "Per-trial results of an evaluation job: task, attempt, reward, error (free).",
          read_only=True)
    def evaluation_results(job_id: JobId) -> Result:
        return dump(gym.evaluation.results(job_id))

    @tool("cancel_evaluation", "Cancel an evaluation job; finished trials keep their results (free).",
          destructive=True, idempotent=True)
    def cancel_evaluation(job_id: JobId) -> Result:
        return dump(gym.evaluation.cancel(job_id))

    @tool("list_evaluations", "List the run's evaluation jobs with their status and scores (free).", read_only=True)
    def list_evaluations() -> Result:
        return dump(gym.evaluation.jobs())

    @tool("upload_harness", "Upload a harness (a directory or .tar.gz with harness.toml at its root) from this "
          "machine (free; counts against the storage quota).")
    def upload_harness(path: Annotated[str, Field(description="a directory or a .tar.gz on this machine")]) -> Result:
        return dump(gym.evaluation.upload_harness(path))

    @tool("list_harnesses", "List the run's uploaded harnesses (free).", read_only=True)
    def list_harnesses() -> Result:
        return dump(gym.evaluation.harnesses())

    @tool("submit", "Hand in the run's result for scoring (free): a checkpoint, a harness or both, as the track "
          "asks; the latest submission before the run ends is scored.")
    def submit(checkpoint: str | None = None, harness: str | None = None, base_model: str | None = None) -> Result:
        return dump(gym.submit(checkpoint=checkpoint, harness=harness, base_model=base_model))


def _sandboxes(tool: ToolRegistrar, gym: Gym) -> None:
    @tool("sandbox_create", "Start a sandbox (an isolated Linux machine, no network unless granted); metered per "
          "second until killed or its timeout.")
    def sandbox_create(
        template: str | None = None,
        timeout_s: Annotated[int | None, Field(ge=1, description="kill it after this many seconds")] = None,
    ) -> Result:
        return dump(gym.sandbox.create(template, timeout=timeout_s).info())

    @tool("sandbox_exec", "Run a shell command in a sandbox and return its stdout, stderr and exit code (the "
          "sandbox's seconds are metered).")
    def sandbox_exec(
        sandbox_id: SandboxId,
        command: Annotated[str, Field(description="run with bash -l -c")],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: Annotated[float | None, Field(gt=0, description="kill the command after this long")] = None,
    ) -> Result:
        return dump(Sandbox(gym, sandbox_id).run(command, envs=env, cwd=cwd, timeout=timeout_s))

    @tool("sandbox_kill", "Kill a sandbox, which stops its metering; returns its final record (free).",
          destructive=True, idempotent=True)
    def sandbox_kill(sandbox_id: SandboxId) -> Result:
        killed = gym.sandbox.kill(sandbox_id)
        return dump(gym.sandbox.get(sandbox_id), killed=killed)

    @tool("list_sandboxes", "List the run's sandboxes, running and ended, with seconds and cost (free).",
          read_only=True)
    def list_sandboxes(state: Annotated[str | None, Field(description="e.g. running")] = None) -> Result:
        return dump(gym.sandbox.list(state=state))
