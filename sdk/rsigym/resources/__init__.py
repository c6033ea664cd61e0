from .chat import AsyncInference, AsyncOpenAICompatible, AsyncRollout, Inference, OpenAICompatible, Rollout
from .keys import AsyncKeys, Keys
from .training import AsyncTraining, Training

__all__ = [
    "OpenAICompatible", "AsyncOpenAICompatible", "Rollout", "AsyncRollout", "Inference", "AsyncInference",
    "Keys", "AsyncKeys", "Training", "AsyncTraining",
]
