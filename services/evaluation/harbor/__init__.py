"""Harbor trials on the gym's sandboxes: the environment Harbor runs a trial's agent and verifier in.

* :mod:`.environment` — the Harbor environment (``GymSandboxEnvironment``): one gym sandbox.
* :mod:`.trial_sandboxes` — a trial's credentials, client and account of its sandboxes.
* :mod:`.image_plan` — the task's Dockerfile as the plan a trial's sandbox is given at start.
* :mod:`.deferred_setup` — directories and modes that wait for the next command or read.
* :mod:`.known_commands` — which of Harbor's commands the environment skips or answers itself,
  pinned to the Harbor release they were read from.
* :mod:`.sandbox_sdk` — the ``e2b`` SDK's handle on a sandbox, and reads tried again.
"""
