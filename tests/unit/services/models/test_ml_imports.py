"""The first model loads of a process may come from several threads at once (a training job
loading its weights while the first inference requests load the base and peft): none of them may
fail. transformers resolves its names lazily and not thread-safely — unserialized, one thread in
several gets ``cannot import name 'AutoModel…'``, a 500 for an inference call (seen in the DAG
agent's test), and two ``from_pretrained`` at once can leave one with meta tensors. Run in a fresh
interpreter, where nothing is imported yet (the race showed 3 times in 3 without the fix)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kit.config import BaseModel_
from services.models.loading import resolve_model_dir
from tests.conftest import MODELS_DIR

ROOT = Path(__file__).resolve().parents[4]
RACE = """
import sys, threading
from services.models.loading import load_model, load_tokenizer
path, barrier, errors = sys.argv[1], threading.Barrier(6), []
def first_use(i):
    barrier.wait()
    try:
        if i % 3 == 0:
            load_model(path)
        elif i % 3 == 1:
            load_tokenizer(path)
        else:
            from peft import PeftModel  # what the inference engine imports for its first adapter
    except Exception as err:
        errors.append(repr(err)[:200])
threads = [threading.Thread(target=first_use, args=(i,)) for i in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
sys.exit(1 if errors else 0)
"""


def test_concurrent_first_loads_in_a_fresh_process_all_succeed() -> None:
    path = resolve_model_dir(BaseModel_(name="tiny", path="builtin:tiny", train_usd_per_mtok=1, prefill_usd_per_mtok=1,
                                        sample_usd_per_mtok=1), MODELS_DIR)
    done = subprocess.run([sys.executable, "-c", RACE, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
