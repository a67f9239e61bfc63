"""The wire format of the ranking services: read and check a request body, render the answer with orjson.

Every check runs before a query joins a micro-batch, so a bad request is answered alone and never
reaches the encoder that other clients' queries share:

- the body is read in chunks and counted, so a chunked body over ``max_body_bytes`` gets 413 as soon as
  it passes the limit (the Content-Length header alone is not trusted), and a body that trickles in for
  longer than ``body_timeout_s`` gets 408;
- it is parsed by orjson, which accepts strict JSON only: ``NaN``, ``Infinity``, numbers out of the
  double range (``1e400``), invalid UTF-8 and lone surrogate escapes (``"\\ud800"``) get 422 with
  orjson's reason;
- the fields are checked by pydantic (strict types), then each query (`query_problem`).

``topk`` absent, null or 0 means the server's default, as in the reference servers (``request.topk or
default``); ``queries: []`` answers ``{"result": []}`` with 200, as the reference does.

Example:
    >>> request = parse_request(b'{"queries": ["Oslo"], "topk": 0}', ServiceLimits(), default_topk=3)
    >>> request.queries, request.topk
    (['Oslo'], 3)
    >>> try:
    ...     parse_request(b'{"queries": ["Oslo"], "topk": 1e400}', ServiceLimits(), default_topk=3)
    ... except RequestRejected as rejected:
    ...     print(rejected.status_code, rejected.message)
    422 the request body is not valid JSON: number is infinity when parsed as double: line 1 column 31 (char 30)
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

DocumentFormats = Mapping[str, Callable[[Any], Any]]
"""Named renderings of a hit's ``document``; the first one is the default."""

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclasses.dataclass
class ServiceLimits:
    """Input limits of a search service; requests beyond them get a 4xx and do no work."""

    max_queries: int = 256
    """Most queries in one request (413 beyond)."""
    max_query_chars: int = 8_192
    """Longest query in characters (413 beyond)."""
    max_topk: int = 100
    """Largest ``topk`` (422 beyond)."""
    max_body_bytes: int = 4 * 1024 * 1024
    """Largest request body in bytes, counted as it is received, chunked bodies included (413 beyond)."""
    body_timeout_s: float = 30.0
    """Longest time to receive a body once its headers are in (408 beyond): a slow body holds no connection."""


class SearchRequest(BaseModel):
    """The reference request body, plus rapo's optional ``document_format``."""

    model_config = ConfigDict(extra="ignore")

    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = True
    document_format: StrictStr | None = None


class RequestRejected(Exception):
    """A request broke a rule; carries the HTTP status and the message sent back as ``{"detail": ...}``.

    ``close`` ends the connection after the answer: the rest of an unread body is not worth receiving.
    """

    def __init__(self, status_code: int, message: str, close: bool = False):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.close = close

    def response(self) -> Response:
        """The JSON error answer."""
        return json_response({"detail": self.message}, self.status_code, close=self.close)


def json_response(payload: Any, status_code: int = 200, close: bool = False) -> Response:
    """``payload`` serialised by orjson (numpy scalars and arrays included); ``close`` asks the server to close
    the connection after sending it."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {"connection": "close"} if close else None
    return Response(body, status_code, headers=headers, media_type="application/json")


def query_problem(query: str, max_chars: int) -> tuple[int, str] | None:
    """Why ``query`` cannot be searched, as ``(HTTP status, reason)``, or None when it can.

    Example:
        >>> query_problem("ok", 100), query_problem(" ", 100), query_problem("a\\ud800", 100)
        (None, (422, 'is empty'), (422, 'holds a lone surrogate (U+D800) at character 1; send valid Unicode text'))
    """
    if not query.strip():
        return 422, "is empty"
    if len(query) > max_chars:
        return 413, f"is {len(query)} characters long; the limit is {max_chars}"
    surrogate = _SURROGATE.search(query)
    if surrogate is not None:
        return 422, (
            f"holds a lone surrogate (U+{ord(surrogate.group()):04X}) at character {surrogate.start()}; "
            "send valid Unicode text"
        )
    return None


async def read_body(request: Request, limits: ServiceLimits) -> bytes:
    """The request body, refused (413) once more than ``max_body_bytes`` arrived, or (408) when too slow."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise RequestRejected(
            413, f"request body is {int(declared)} bytes; the limit is {limits.max_body_bytes}", close=True
        )
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                received += len(chunk)
                if received > limits.max_body_bytes:
                    raise RequestRejected(
                        413, f"request body is over {limits.max_body_bytes} bytes, the limit (stopped reading)", True
                    )
                chunks.append(chunk)
    except TimeoutError as error:
        message = f"the request body took more than {limits.body_timeout_s:g} s to arrive"
        raise RequestRejected(408, message, close=True) from error
    return b"".join(chunks)


def _validation_message(error: ValidationError) -> str:
    # Never echo the input back: it may be huge, or not serialisable (the reason 1e400 once gave a 500).
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}"
        for item in error.errors(include_url=False, include_input=False)
    )


def parse_request(
    body: bytes, limits: ServiceLimits, default_topk: int, formats: DocumentFormats | None = None
) -> SearchRequest:
    """Parse and check a request body; ``topk`` and ``document_format`` come back resolved.

    Raises:
        RequestRejected: 422 for malformed JSON, wrong types, a bad ``topk`` or query; 413 beyond a size limit.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RequestRejected(422, f"the request body is not valid JSON: {error}") from error
    if not isinstance(payload, dict):
        raise RequestRejected(422, f"the request body must be a JSON object, got {type(payload).__name__}")
    try:
        request = SearchRequest.model_validate(payload)
    except ValidationError as error:
        raise RequestRejected(422, _validation_message(error)) from error
    if len(request.queries) > limits.max_queries:
        raise RequestRejected(
            413, f"{len(request.queries)} queries in one request; the limit is {limits.max_queries}, split the request"
        )
    topk = request.topk or default_topk
    if not 1 <= topk <= limits.max_topk:
        raise RequestRejected(
            422, f"'topk' must be between 1 and {limits.max_topk} (0 or absent: {default_topk}), got {request.topk}"
        )
    for position, query in enumerate(request.queries):
        problem = query_problem(query, limits.max_query_chars)
        if problem is not None:
            raise RequestRejected(problem[0], f"query {position} {problem[1]}")
    document_format = request.document_format
    if document_format is not None and document_format not in (formats or {}):
        choices = ", ".join(formats) if formats else "none: this service returns one kind of document"
        raise RequestRejected(422, f"unknown 'document_format' {document_format!r}; choices: {choices}")
    if document_format is None and formats:
        document_format = next(iter(formats))
    return request.model_copy(update={"topk": topk, "document_format": document_format})


def render_answer(
    ranked: Sequence[Sequence[dict[str, Any]]], request: SearchRequest, formats: DocumentFormats | None = None
) -> Response:
    """``{"result": [[hit, ...], ...]}``: documents in the requested format, scores kept or dropped."""
    render = formats[request.document_format] if formats and request.document_format else None
    result = []
    for hits in ranked:
        entries = []
        for hit in hits:
            entry = dict(hit)
            if render is not None:
                entry["document"] = render(entry["document"])
            if request.return_scores:
                entry["score"] = float(entry.get("score", 0.0))
            else:
                entry.pop("score", None)
            entries.append(entry)
        result.append(entries)
    return json_response({"result": result})
