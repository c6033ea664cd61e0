from .chat import AsyncOpenAICompatible, AsyncRollout, OpenAICompatible, Rollout
from .keys import AsyncKeys, Keys

__all__ = ["OpenAICompatible", "AsyncOpenAICompatible", "Rollout", "AsyncRollout", "Keys", "AsyncKeys"]
