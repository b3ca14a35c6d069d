"""Request and response models of the HTTP server (OpenAI-compatible and SGLang's ``/generate``).

Static bounds live here (types, signs, ranges the JSON schema can state); bounds that depend on
the loaded model (vocabulary size, context length) are checked by the app, which names the
offending field the same way. Every rejection is an ``ErrorResponse`` (OpenAI's error shape).

Types are JSON's: an integer field takes a whole number (``1`` or ``1.0``, never ``true`` or
``"1"``), a number field takes a number (never a boolean or a string); token ids must be JSON
integers (a list of ids is validated without a Python call per element). Every string is valid
Unicode: a lone surrogate (``"\\ud800"``, which JSON can spell) is rejected with the field named.

Defaults follow the API each endpoint imitates: OpenAI's ``temperature=1``, ``max_tokens=16``
for completions and "up to the context" for chat (capped by the server's
``--max-completion-tokens``); SGLang's ``max_new_tokens=128`` for ``/generate``. Unknown fields
are ignored (clients send options we do not implement, such as ``logprobs``); ``n`` other than 1
is rejected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_STOP_STRINGS = 4
# Stop strings are matched incrementally in linear time; the cap bounds the per-request setup.
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_KEY_CHARS = 256


def valid_unicode(text: str) -> str:
    """``text`` unchanged, or ValueError when it holds a lone UTF-16 surrogate (it cannot be
    encoded, tokenized or sent back)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"contains a lone surrogate U+{ord(text[e.start]):04X} at index {e.start}, "
                "which is not valid Unicode"
            ) from None
    return text


def whole_number(value: Any) -> Any:
    """A float with no fractional part becomes an int (JSON has one number type); anything
    else is left for the strict integer check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Bounds go before the validators so that the JSON schema states them.
_Unicode = AfterValidator(valid_unicode)
_Whole = BeforeValidator(whole_number)
Text = Annotated[str, _Unicode]
TokenId = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
Priority = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX), _Whole]
Seed = Annotated[StrictInt, Field(ge=0, le=INT64_MAX), _Whole]
MaxTokens = Annotated[StrictInt, Field(ge=1), _Whole]
TopK = Annotated[StrictInt, Field(ge=-1), _Whole]
ShortKey = Annotated[str, Field(max_length=MAX_KEY_CHARS), _Unicode]
StopStrings = (
    Annotated[str, Field(max_length=MAX_STOP_CHARS), _Unicode]
    | Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS), _Unicode]],
        Field(max_length=MAX_STOP_STRINGS),
    ]
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

    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: TopK = Field(default=-1, description="-1 or 0: off (SGLang extension)")
    seed: Seed | None = None
    stop: StopStrings | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: StrictBool = False
    n: Annotated[StrictInt, Field(ge=1, le=1), _Whole] = Field(
        default=1, description="only one choice per request"
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    return_cached_tokens_details: StrictBool = Field(
        default=False,
        description="SGLang extension: add sglext.cached_tokens_details {device, host}",
    )


# ---- /v1/completions --------------------------------------------------------------------------


class CompletionRequest(_SamplingFields):
    model: Text
    prompt: Text | Annotated[list[TokenId], Field(min_length=1)]
    max_tokens: MaxTokens | None = None


class CompletionChoice(_Model):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None
    # SGLang extension: the stop token id or stop string that ended the choice.
    matched_stop: int | str | None = None


class PromptTokensDetails(_Model):
    cached_tokens: int


class Usage(_Model):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CachedTokensDetails(_Model):
    """Where a prompt's cached tokens came from (SGLang's ``sglext``): the device KV pool or
    the host tier."""

    device: int
    host: int


class SglExt(_Model):
    """SGLang's extension object on OpenAI-compatible responses (sent when the request asks
    with ``return_cached_tokens_details``)."""

    cached_tokens_details: CachedTokensDetails | None = None


class CompletionResponse(_Model):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    sglext: SglExt | None = None


# ---- /v1/chat/completions -----------------------------------------------------------------


class TextPart(_Model):
    type: Literal["text"]
    text: Text


class ChatMessage(_Model):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | Annotated[list[TextPart], Field(min_length=1)]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    model: Text
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
    matched_stop: int | str | None = None


class ChatCompletionResponse(_Model):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    sglext: SglExt | None = None


# ---- /generate (SGLang's native API) ------------------------------------------------------------


class GenerateSamplingParams(_Model):
    max_new_tokens: MaxTokens = 128
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: TopK = Field(default=-1, description="-1 or 0: off")
    seed: Seed | None = None
    stop: StopStrings | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: StrictBool = False


class GenerateRequest(SchedulingFields):
    """Exactly one of ``text`` and ``input_ids`` (the schema says so with ``oneOf``)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "oneOf": [
                {"required": ["text"], "properties": {"text": {"type": "string"}}},
                {"required": ["input_ids"], "properties": {"input_ids": {"type": "array"}}},
            ]
        },
    )

    text: Text | None = None
    input_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    sampling_params: GenerateSamplingParams = Field(
        default_factory=lambda: GenerateSamplingParams()
    )
    stream: StrictBool = False
    rid: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS), _Unicode] | None = None

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
    cached_tokens_details: CachedTokensDetails
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
    """One served model; ``id`` is the name requests must send (the served model name),
    ``root`` the model it was loaded from (vLLM's and SGLang's field)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixsched"
    root: str | None = None
    max_model_len: int
    vocab_size: int


class ModelList(_Model):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ServerInfo(_Model):
    """The server's model, limits and scheduler settings. ``model_path``, ``served_model_name``,
    ``tokenizer_path``, ``max_total_num_tokens``, ``tp_size``, ``dp_size`` and ``version`` carry
    SGLang's names: sglang-router reads them when a worker registers (a worker without
    ``served_model_name`` is registered under the model ``unknown``)."""

    model: str
    model_path: str
    served_model_name: str
    tokenizer_path: str | None
    max_total_num_tokens: int
    tp_size: int = 1
    dp_size: int = 1
    version: str
    vocab_size: int
    context_len: int
    kv_slots: int
    max_running_requests: int
    max_request_bytes: int
    max_prompt_chars: int
    max_completion_tokens: int | None
    allowed_hosts: list[str]
    allowed_origins: list[str]
    scheduler: dict[str, Any]


class WorkerLoad(_Model):
    """One entry of SGLang's ``/get_load`` (one per data-parallel rank; radixsched has one):
    requests running or queued, the queued ones, and KV tokens in use."""

    dp_rank: int
    num_reqs: int
    num_waiting_reqs: int
    num_tokens: int


class ModelInfo(_Model):
    """SGLang's ``/model_info`` (``sglang.bench_serving`` loads the tokenizer from
    ``tokenizer_path``)."""

    model_path: str
    tokenizer_path: str | None
    is_generation: bool = True
    preferred_sampling_params: dict[str, Any] | None = None
    weight_version: str = "default"
    has_image_understanding: bool = False
    has_audio_understanding: bool = False
    model_type: str | None = None
    architectures: list[str] | None = None


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
    "MAX_STOP_CHARS",
    "CachedTokensDetails",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorBody",
    "ErrorResponse",
    "GenerateRequest",
    "GenerateResponse",
    "ModelInfo",
    "ModelList",
    "ServerInfo",
    "SglExt",
    "Usage",
    "stop_strings",
]
