"""RSIGym client SDK: ``from rsigym import Gym, AsyncGym``.

Only httpx and pydantic are required; nothing of the server is imported.
"""

from ._client import AsyncGym, Gym
from ._streaming import AsyncStream, Stream
from ._version import __version__
from .errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    BudgetExhaustedError,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RSIGymError,
    ServiceUnavailableError,
    UnprocessableEntityError,
)
from .types import (
    Balance,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    Checkpoint,
    ChildKey,
    Dataset,
    TrainingJob,
    TrainingStepMetrics,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    Model,
    ObjectList,
    ResponseMeta,
    Usage,
)

__all__ = [
    "__version__",
    "Gym",
    "AsyncGym",
    "Stream",
    "AsyncStream",
    # errors
    "RSIGymError",
    "ConfigurationError",
    "APIConnectionError",
    "APITimeoutError",
    "APIResponseValidationError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "BudgetExhaustedError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "RateLimitError",
    "ServiceUnavailableError",
    "InternalServerError",
    # types
    "Balance",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "Usage",
    "Model",
    "Checkpoint",
    "ChildKey",
    "Dataset",
    "TrainingJob",
    "TrainingStepMetrics",
    "ObjectList",
    "ResponseMeta",
]
