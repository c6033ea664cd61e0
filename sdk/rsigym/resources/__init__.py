from .chat import AsyncInference, AsyncOpenAICompatible, AsyncRollout, Inference, OpenAICompatible, Rollout
from .evaluation import AsyncEvaluation, Evaluation
from .keys import AsyncKeys, Keys
from .records import AsyncRecords, Records
from .sandbox import AsyncSandbox, AsyncSandboxes, Sandbox, Sandboxes
from .training import AsyncTraining, Training

__all__ = [
    "OpenAICompatible", "AsyncOpenAICompatible", "Rollout", "AsyncRollout", "Inference", "AsyncInference",
    "Keys", "AsyncKeys", "Training", "AsyncTraining", "Sandboxes", "AsyncSandboxes", "Sandbox", "AsyncSandbox",
    "Evaluation", "AsyncEvaluation", "Records", "AsyncRecords",
]
