"""POST /v1beta/models/{model}:embedContent and :batchEmbedContents, as Google's API takes them.

A request's contents become the normalized EmbeddingRequest the embeddings door makes of
OpenAI's bodies: one input per content (its text parts joined by line breaks: only text
is embedded here), ``outputDimensionality`` as ``dimensions``, ``taskType`` and each
``title`` passed on to upstreams that take them (Gemini). A batch asks for one vector
size and one task type: the normalized request has one of each. The limits are the
embeddings door's (at most MAX_EMBEDDING_INPUTS inputs, each within the model's context
length), and so are the hold and the settlement.

The answer is Google's: ``{"embedding": {"values"}}`` or ``{"embeddings": [...]}``, with
``usageMetadata.promptTokenCount`` as Google's current embedding models report it, and
the charge beside it where generateContent's answer has it (``usageMetadata.cost``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from flask import Response, current_app, g
from marshmallow.validate import Length, OneOf, Range

from app.catalog.registry import EMBEDDING_MODEL, current_catalog
from app.encoding import dumps_transient
from app.errors import InvalidRequest
from app.gemini.schemas import Content, camel_keys
from app.generations.decorators import claimed_generation_id
from app.generations.lifecycle import new_embedding_id, run_embeddings, start_embeddings
from app.generations.models import GEMINI
from app.generations.refusals import (
    MAX_EMBEDDING_INPUTS,
    check_dimensions,
    inputs_within_context,
)
from app.providers.base import EmbeddingRequest, Embeddings
from app.providers.errors import UpstreamError
from app.providers.vectors import UnreadableVector
from app.validation import (
    BETWEEN,
    ONE_OF,
    IntegerField,
    ListOf,
    NestedField,
    ObjectSchema,
    StringField,
    load_or_raise,
)

EMBED_CONTENT, BATCH_EMBED_CONTENTS = "embedContent", "batchEmbedContents"
EMBEDDING_METHODS = (EMBED_CONTENT, BATCH_EMBED_CONTENTS)
# Google's TaskType values.
TASK_TYPES = (
    "TASK_TYPE_UNSPECIFIED",
    "RETRIEVAL_QUERY",
    "RETRIEVAL_DOCUMENT",
    "SEMANTIC_SIMILARITY",
    "CLASSIFICATION",
    "CLUSTERING",
    "QUESTION_ANSWERING",
    "FACT_VERIFICATION",
    "CODE_RETRIEVAL_QUERY",
)
# No embedding model's vectors are longer; a larger number is a mistake, not a request.
MAX_DIMENSIONS = 65_536
# How the text parts of one content are joined into the one text it is embedded as.
PART_SEPARATOR = "\n"
MODEL_PREFIX = "models/"


class EmbedContentRequest(ObjectSchema):
    """One content to embed, and how: Google's EmbedContentRequest."""

    model = StringField()
    content = NestedField(Content, required=True)
    taskType = StringField(validate=OneOf(TASK_TYPES, error=ONE_OF))
    title = StringField()
    outputDimensionality = IntegerField(validate=Range(1, MAX_DIMENSIONS, error=BETWEEN))


class BatchEmbedContentsRequest(ObjectSchema):
    """Several contents to embed: Google's BatchEmbedContentsRequest."""

    requests = ListOf(
        EmbedContentRequest,
        required=True,
        validate=Length(
            min=1,
            max=MAX_EMBEDDING_INPUTS,
            error=f"must hold from 1 to {MAX_EMBEDDING_INPUTS} requests.",
        ),
    )


_EMBED_SCHEMA = EmbedContentRequest()
_BATCH_SCHEMA = BatchEmbedContentsRequest()


def parse_embed_request(body: Any, model: str, *, batch: bool) -> EmbeddingRequest:
    """Validate an embedContent (or, ``batch``, a batchEmbedContents) body for ``model``."""
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    body = camel_keys(body)
    if batch:
        requests = load_or_raise(_BATCH_SCHEMA, body)["requests"]
        names = [f"requests[{index}]." for index in range(len(requests))]
    else:
        requests, names = [load_or_raise(_EMBED_SCHEMA, body)], [""]
    for request, where in zip(requests, names, strict=True):
        check_model_named(request.get("model"), model, f"{where}model")
    return EmbeddingRequest(
        model=model,
        inputs=[
            text_of(request["content"], f"{where}content")
            for request, where in zip(requests, names, strict=True)
        ],
        dimensions=same_in_each(requests, names, "outputDimensionality"),
        task_type=same_in_each(requests, names, "taskType"),
        titles=tuple(request.get("title") for request in requests),
    )


def check_model_named(named: str | None, model: str, param: str) -> None:
    """Refuse a request of a batch that names another model than the path does."""
    if named is not None and named.removeprefix(MODEL_PREFIX) != model:
        raise InvalidRequest(
            f"{param} must be the model of the path, '{MODEL_PREFIX}{model}'; it is {named!r}.",
            param=param,
        )


def text_of(content: dict[str, Any], where: str) -> str:
    """Return the one text a content is embedded as: its text parts, joined."""
    texts = []
    for index, part in enumerate(content["parts"]):
        if "text" not in part:
            raise InvalidRequest(
                f"{where}.parts[{index}] must be a text part: only text is embedded here.",
                param=f"{where}.parts[{index}]",
            )
        texts.append(part["text"])
    text = PART_SEPARATOR.join(texts)
    if not text:
        raise InvalidRequest(f"{where} must hold some text.", param=f"{where}.parts")
    return text


def same_in_each(requests: list[dict[str, Any]], names: list[str], key: str) -> Any:
    """Return ``key``'s value, which every request of a batch must give alike (or leave out)."""
    value = requests[0].get(key)
    for request, where in zip(requests, names, strict=True):
        if request.get(key) != value:
            raise InvalidRequest(
                f"{where}{key} must be the same in every request of a batch.",
                param=f"{where}{key}",
            )
    return value


def embed(model_name: str, method: str, body: Any) -> Response:
    """Embed the contents, paid from the caller's credits; answer in Google's shape."""
    batch = method == BATCH_EMBED_CONTENTS
    request = parse_embed_request(body, model_name, batch=batch)
    model = current_catalog().resolve(
        model_name, may_use=g.caller.may_use, model_type=EMBEDDING_MODEL
    )
    check_dimensions(request, model, param="outputDimensionality")
    inputs_within_context(
        request, model, item_name="requests[{index}].content" if batch else "content"
    )
    generation = start_embeddings(
        g.caller,
        model,
        request,
        api=GEMINI,
        hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
        generation_id=claimed_generation_id() or new_embedding_id(),
    )
    embeddings, cost = run_embeddings(generation, request)
    try:
        answer = embed_answer(embeddings, cost, batch=batch)
    except UnreadableVector:
        # Settled already, at the usage the upstream reported: it answered, and billed.
        raise UpstreamError(
            "The model's upstream answered a vector the gateway cannot read."
        ) from None
    # Sent once and dropped, as the embeddings door's answers are.
    return Response(dumps_transient(answer), mimetype="application/json")


def embed_answer(embeddings: Embeddings, cost: Decimal, *, batch: bool) -> dict[str, Any]:
    """Build an EmbedContentResponse (one vector) or a BatchEmbedContentsResponse."""
    vectors = [{"values": vector.as_floats()} for vector in embeddings.vectors]
    usage = {
        "promptTokenCount": embeddings.usage.prompt_tokens,
        "cost": {"totalCost": cost},
    }
    if batch:
        return {"embeddings": vectors, "usageMetadata": usage}
    return {"embedding": vectors[0], "usageMetadata": usage}
