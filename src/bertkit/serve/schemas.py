"""Request and response bodies as pydantic models: they validate requests and give /openapi.json its schemas.

Requests are strict (no "3" for 3, no true for 1) and closed (an unknown field is an error, so a typo is not silently
ignored). Embedding `inputs` / `input` take a string, a list of token ids, or a list of those, as
text-embeddings-inference and OpenAI do; ids are the model's whole input ([CLS] and [SEP] included, as /tokenize gives
them): none are added.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("is empty")
    return value


Text = Annotated[str, AfterValidator(_not_blank)]
Texts = Annotated[list[Text], BeforeValidator(lambda v: [v] if isinstance(v, str) else v,
                                              json_schema_input_type=Union[str, list[str]]),
                  Field(min_length=1, description="a text or a list of texts")]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def _as_inputs(value: Any) -> Any:
    """A text, a list of token ids, or a list of those -> a list of (text or ids), each checked here so that a
    mistake names its item (a union's own errors would name its members)."""
    items = [value] if isinstance(value, str) or (_is_ids(value) and value) else value
    if not isinstance(items, list):
        return items                       # the list type's own error: "must be a list"
    for i, item in enumerate(items):
        if not (isinstance(item, str) or _is_ids(item)):
            raise PydanticCustomError("inputs_type", f"item {i} must be a text or a list of token ids")
        if not (item.strip() if isinstance(item, str) else item):
            raise ValueError(f"item {i} is empty")
        if not isinstance(item, str) and min(item) < 0:
            raise ValueError(f"item {i} has a negative token id {min(item)}")
    return items


_INPUTS = "a text, a list of token ids (the model's whole input), or a list of those"
_INPUT_SHAPES = Union[str, list[int], list[Union[str, list[int]]]]
Inputs = Annotated[list[Union[str, list[int]]], BeforeValidator(_as_inputs, json_schema_input_type=_INPUT_SHAPES),
                   Field(min_length=1, description=_INPUTS)]
Direction = Literal["Left", "Right"]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorBody(BaseModel):
    error: str = Field(description="what was wrong, in one line")
    error_type: Literal["Validation", "Overloaded", "Backend"] = Field(description="text-embeddings-inference's kind")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None = Field(description="the request field at fault, where one is")
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


# --------------------------------------------------------------------------------------------- bertkit's own routes

class EmbedRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"text": "A man is eating food."}})
    text: Text = Field(description="input text")
    pooling: Literal["mean", "cls"] | None = Field(None, description="the encoder's mean or [CLS] vector; default: "
                                                      "the model's own pooling (and Dense layers)")
    normalize: bool = True


class EmbedResult(BaseModel):
    embedding: list[float]


class FillMaskRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"text": "Paris is the [MASK] of France."}})
    text: str = Field(description="text with one or more [MASK] (at most the server's max_masks)")
    top_k: int = Field(5, ge=1, description="candidates to return (at most the server's max_top_k)")
    beam_size: int = Field(8, ge=1, description="beam width of the decoding (at most the server's max_beam_size)")


class WordCandidate(BaseModel):
    word: str
    score: float
    pieces: list[str]
    sequence: str


class JointCandidate(BaseModel):
    tokens: list[str]
    score: float
    log_pll: float
    sequence: str


class FillMaskResult(BaseModel):
    masks: int
    candidates: Union[list[WordCandidate], list[JointCandidate]]


class ClassifyRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"text": "a gripping, funny film"}})
    text: Text = Field(description="input text")
    pair: Text | None = Field(None, description="second text (pair tasks)")


class ClassifyResult(BaseModel):
    label: str | None = None
    score: float | None = None
    scores: dict[str, float] | None = None
    value: float | None = Field(None, description="regression models only")


class TagRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"text": "Tony Blair visited Paris."}})
    text: Text = Field(description="input text")


class TaggedWord(BaseModel):
    word: str
    start: int
    end: int
    label: str | None
    score: float | None


class AnswerRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"question": "Who visited Paris?",
                                                             "context": "Tony Blair visited Paris."}})
    question: Text
    context: Text


class AnswerResult(BaseModel):
    answer: str
    score: float
    start: int | None
    end: int | None


class Health(BaseModel):
    status: str
    model: str
    endpoints: list[str]
    max_batch: int
    batches: dict[str, dict[str, int]]


# ------------------------------------------------------------------------------- text-embeddings-inference routes

class EmbedAllRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"inputs": "A man is eating food."}})
    inputs: Inputs
    truncate: bool = Field(False, description="cut inputs past the maximum input length instead of refusing them")
    truncation_direction: Direction = Field("Right", description="the end to cut from: Right keeps the start")


class TeiEmbedRequest(EmbedAllRequest):
    model_config = ConfigDict(json_schema_extra={"example": {"inputs": ["A man is eating food."]}})
    normalize: bool = True
    dimensions: int | None = Field(None, ge=1, description="keep the first k components (Matryoshka), then "
                                                           "normalise if normalize; at most the model's width")
    prompt_name: str | None = Field(None, description="the model's prompt of this name goes before each input "
                                                       "(default: its default_prompt_name)")


class DecodeRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"ids": [101, 7592, 2088, 102]}})
    ids: Annotated[list[list[Annotated[int, Field(ge=0)]]], BeforeValidator(
        lambda v: [v] if _is_ids(v) else v, json_schema_input_type=Union[list[int], list[list[int]]])] = Field(
        min_length=1, description="token ids, or a list of those")
    skip_special_tokens: bool = True


def _embed_shape(body: Any) -> str:
    # a body with neither field is read as TEI's, so the error names `inputs`: what a TEI client should send
    return "text" if isinstance(body, dict) and "text" in body and "inputs" not in body else "tei"


AnyEmbedRequest = Annotated[Union[Annotated[EmbedRequest, Tag("text")], Annotated[TeiEmbedRequest, Tag("tei")]],
                            Discriminator(_embed_shape)]
AnyEmbedResult = Union[EmbedResult, list[list[float]]]


class PredictInputs(BaseModel):
    model_config = ConfigDict(strict=True)
    batch: bool
    items: list[Annotated[list[Text], Field(min_length=1, max_length=2)]] = Field(min_length=1)


def _predict_inputs(value: Any) -> Any:
    """TEI's shapes: "text", ["text", "pair"], or a list of "text" / ["text"] / ["text", "pair"]."""
    if isinstance(value, str):
        return {"batch": False, "items": [[value]]}
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return {"batch": False, "items": [value]}
    if isinstance(value, list):
        return {"batch": True, "items": [[v] if isinstance(v, str) else v for v in value]}
    return value


class PredictRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"inputs": "a gripping, funny film"}})
    inputs: Annotated[PredictInputs, BeforeValidator(
        _predict_inputs, json_schema_input_type=Union[str, list[Union[str, list[str]]]])] = Field(
        description='a text, a ["text", "pair"], or a list of those')
    raw_scores: bool = False
    truncate: bool = False


class Prediction(BaseModel):
    label: str
    score: float


PredictResult = Union[list[Prediction], list[list[Prediction]]]


class RerankRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"query": "What is Paris?",
                                                             "texts": ["Paris is a city.", "Bread is food."]}})
    query: Text
    texts: list[Text] = Field(min_length=1)
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TokenizeRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"inputs": "A man is eating food."}})
    inputs: Texts
    add_special_tokens: bool = True


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Info(BaseModel):
    model_id: str
    model_type: str
    task: str
    dims: int
    quantization: str | None = None          # "bertkit-int8" for a model written by `bertkit quantize`
    max_input_length: int
    max_client_batch_size: int
    max_batch_requests: int
    max_concurrent_requests: int
    labels: list[str] | None = None
    version: str
    precision: str = "fp32"                  # the forwards': fp32, or bf16 autocast when the server was started so


# --------------------------------------------------------------------------------------------------------- OpenAI

class OpenAIEmbedRequest(Request):
    model_config = ConfigDict(json_schema_extra={"example": {"input": "A man is eating food.", "model": "bertkit"}})
    input: Inputs
    model: str = Field(description="any name: the server has one model and answers with its id")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first k components (Matryoshka), then "
                                                           "normalise; at most the model's width")
    user: str | None = None


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str] = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbedResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: Usage
