"""Request and response models of the HTTP server (OpenAI-compatible and SGLang's ``/generate``).

Static bounds live here (types, signs, ranges the JSON schema can state); bounds that depend on
the loaded model (vocabulary size, context length) are checked by the app, which names the
offending field the same way. Every rejection is an ``ErrorResponse`` (OpenAI's error shape).

Defaults follow the API each endpoint imitates: OpenAI's ``temperature=1``, ``max_tokens=16``
for completions and "up to the context" for chat; SGLang's ``max_new_tokens=128`` for
``/generate``. Unknown fields are ignored (clients send options we do not implement, such as
``logprobs``); ``n`` other than 1 is rejected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_STOP_STRINGS = 4
MAX_STOP_TOKEN_IDS = 64
MAX_KEY_CHARS = 256

TokenId = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
Priority = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)]
Seed = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
MaxTokens = Annotated[StrictInt, Field(ge=1)]
ShortKey = Annotated[str, Field(max_length=MAX_KEY_CHARS)]
StopStrings = (
    str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)]
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---- errors --------------------------------------------------------------------------------


class ErrorBody(_Model):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Model):
    error: ErrorBody


# ---- shared request fields ---------------------------------------------------------------------


class StreamOptions(_Model):
    include_usage: StrictBool = False


class SchedulingFields(_Model):
    """Scheduling fields every generation endpoint accepts (SGLang's names)."""

    priority: Priority | None = None
    routing_key: ShortKey | None = None
    extra_key: ShortKey | None = None
    cache_salt: ShortKey | None = None


class _SamplingFields(SchedulingFields):
    """Sampling options shared by the two OpenAI endpoints (names as OpenAI/SGLang spell them)."""

    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt = Field(default=-1, ge=-1, description="-1 or 0: off (SGLang extension)")
    seed: Seed | None = None
    stop: StopStrings | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = Field(default=1, ge=1, le=1, description="only one choice per request")
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


# ---- /v1/completions --------------------------------------------------------------------------


class CompletionRequest(_SamplingFields):
    model: str
    prompt: str | Annotated[list[TokenId], Field(min_length=1)]
    max_tokens: MaxTokens | None = None


class CompletionChoice(_Model):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class PromptTokensDetails(_Model):
    cached_tokens: int


class Usage(_Model):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionResponse(_Model):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ---- /v1/chat/completions -----------------------------------------------------------------


class TextPart(_Model):
    type: Literal["text"]
    text: str


class ChatMessage(_Model):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    @property
    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Model):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(_Model):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


# ---- /generate (SGLang's native API) ------------------------------------------------------------


class GenerateSamplingParams(_Model):
    max_new_tokens: MaxTokens = 128
    temperature: float = Field(default=1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt = Field(default=-1, ge=-1, description="-1 or 0: off")
    seed: Seed | None = None
    stop: StopStrings | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: StrictBool = False


class GenerateRequest(SchedulingFields):
    text: str | None = None
    input_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    sampling_params: GenerateSamplingParams = Field(
        default_factory=lambda: GenerateSamplingParams()
    )
    stream: StrictBool = False
    rid: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)] | None = None

    @model_validator(mode="after")
    def _exactly_one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of 'text' and 'input_ids' must be given")
        return self


class GenerateMetaInfo(_Model):
    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # SGLang's shape: {"type": "stop"|"length"|"abort", "matched"?: token id or string,
    # "length"?: int, "message"?: str}; None while a stream is still running.
    finish_reason: dict[str, Any] | None
    e2e_latency: float


class GenerateResponse(_Model):
    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo


# ---- misc endpoints ---------------------------------------------------------------------------


class ModelCard(_Model):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixsched"
    max_model_len: int
    vocab_size: int


class ModelList(_Model):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ServerInfo(_Model):
    model: str
    vocab_size: int
    context_len: int
    kv_slots: int
    max_running_requests: int
    scheduler: dict[str, Any]


class HealthResponse(_Model):
    status: Literal["ok", "unhealthy"]


class FlushCacheResponse(_Model):
    message: str
    freed_tokens: int


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """The non-empty stop strings of a request's ``stop`` field."""
    if stop is None:
        return ()
    return tuple(s for s in ([stop] if isinstance(stop, str) else stop) if s)


__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorBody",
    "ErrorResponse",
    "GenerateRequest",
    "GenerateResponse",
    "ModelList",
    "ServerInfo",
    "Usage",
    "stop_strings",
]
