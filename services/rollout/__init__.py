"""Rollout service: frontier (catalogue) models through LiteLLM."""

import os

# LiteLLM fetches a price map from the internet at import unless told not to; the gym
# prices calls from its own catalogue, so the bundled copy is enough.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
