"""Custom losses run outside the training process, with nothing to steal and nowhere to write.

The trainer computes logits; a separate process — new user, mount, PID, IPC and network
namespaces (bubblewrap), an empty environment, the host read-only, one writable scratch dir —
runs the agent's ``loss(logits, labels, mask)`` and sends back the loss and its gradient with
respect to the logits, which the trainer backpropagates (Tinker's forward_backward_custom
shape). The platform's credentials, sockets and data dir never exist in that process.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from services.core.errors import Unprocessable

RUNNER = r'''
import io, sys, torch
ns = {}
exec(compile(open(sys.argv[1]).read(), "custom_loss.py", "exec"), ns)
data = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=True)
logits = data["logits"].requires_grad_(True)
loss = ns["loss"](logits, data["labels"], data["mask"])
if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
    raise SystemExit("loss() must return a scalar tensor")
loss.backward()
out = io.BytesIO()
torch.save({"loss": loss.detach(), "grad": logits.grad}, out)
sys.stdout.buffer.write(out.getvalue())
'''


class CustomLossError(Exception):
    """The agent's loss failed this step; the message is safe to show to the agent."""


def sandbox_command(scratch: Path, argv: list[str]) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise Unprocessable("custom losses need bubblewrap (bwrap) on the training host", param="loss")
    return [
        bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--clearenv",
        "--ro-bind", "/", "/",
        # Empty read-only mounts over the usual writable places; the loss's own dir is /tmp/work.
        "--tmpfs", "/home", "--remount-ro", "/home", "--tmpfs", "/run", "--remount-ro", "/run",
        "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        # The interpreter and its packages stay visible even when they live under /tmp.
        "--ro-bind", sys.prefix, sys.prefix, "--ro-bind", sys.base_prefix, sys.base_prefix,
        "--bind", str(scratch), "/tmp/work", "--remount-ro", "/tmp", "--chdir", "/tmp/work",
        "--setenv", "HOME", "/tmp/work", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        *argv,
    ]


class LossSandbox:
    def __init__(self, source: str, timeout_s: float, hidden: list[Path]):
        """``hidden``: host paths masked inside the sandbox (the gym's data dir)."""
        self.source = source
        self.timeout_s = timeout_s
        self.hidden = [p for p in hidden if Path(p).exists()]

    def __call__(self, logits: Any, labels: Any, mask: Any) -> tuple[Any, Any]:
        import torch

        buf = io.BytesIO()
        torch.save({"logits": logits.detach().float().cpu(), "labels": labels.cpu(), "mask": mask.cpu()}, buf)
        scratch = Path(tempfile.mkdtemp(prefix="rsigym-loss-"))
        try:
            (scratch / "custom_loss.py").write_text(self.source)
            (scratch / "runner.py").write_text(RUNNER)
            argv = sandbox_command(scratch, [sys.executable, "-I", "/tmp/work/runner.py", "/tmp/work/custom_loss.py"])
            for path in self.hidden:  # mask the data dir (keys, tokens, other runs' files), read-only
                mask = ["--tmpfs", str(path), "--remount-ro", str(path)] if Path(path).is_dir() else ["--ro-bind", "/dev/null", str(path)]
                cut = argv.index("--ro-bind") + 3  # right after "--ro-bind / /"
                argv[cut:cut] = mask
            try:
                done = subprocess.run(argv, input=buf.getvalue(), capture_output=True, timeout=self.timeout_s,
                                      env={}, check=False)
            except subprocess.TimeoutExpired:
                raise CustomLossError(f"custom loss timed out after {self.timeout_s:.0f} s") from None
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
                raise CustomLossError("custom loss failed: " + " | ".join(tail)[-600:])
            out = torch.load(io.BytesIO(done.stdout), weights_only=True)
            return out["loss"], out["grad"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

