"""The Tinker training loop's engine: one LoRA training client on a local base model.

``session.LoopSession`` runs Tinker's primitives — ``forward``, ``forward_backward`` (and its
custom-loss form), ``optim_step``, ``sample``, ``save_weights_for_sampler``, ``save_state`` /
``load_state`` — with torch + peft on this host (CUDA when asked). The HTTP protocol the
unmodified ``tinker`` SDK speaks (services/training/tinker_api/) sits on top of it and speaks to
it only in the plain types of ``types`` (lists of ints and floats, no torch).

``losses`` holds Tinker's built-in loss functions as the SDK's documentation defines them;
``sampling`` the token sampler. torch is imported by ``session``, ``losses`` and ``sampling``:
import those where the ``[local]`` extra is installed (``types`` needs nothing).
"""
