"""The witness over HTTP: a Starlette app with the two tlog-witness endpoints.

``POST /add-checkpoint`` and ``GET /<origin hash>/checkpoint`` (``ledger.witness.
protocol``); anything else is 404 (405 for another method on those paths). Bodies are
read up to ``MAX_BODY`` (413 past it) within ``BODY_SECONDS`` (408 past it: a client
sending a byte now and then does not hold a request open), and the SQLite work runs in
the thread pool so a slow disk does not stall other connections.
"""

from __future__ import annotations

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ledger.witness.protocol import MAX_BODY, Answer, Witness

#: Longest time a request body may take to arrive (a body of at most 64 KiB).
BODY_SECONDS = 10.0


def _response(answer: Answer) -> Response:
    # The header as given: Starlette would add "; charset=utf-8" to a text/* media type,
    # and tlog-witness wants exactly ``text/x.tlog.size`` on a 409.
    return Response(
        answer.body, status_code=answer.status, headers={"content-type": answer.content_type}
    )


def create_app(witness: Witness, *, body_seconds: float = BODY_SECONDS) -> Starlette:
    async def add_checkpoint(request: Request) -> Response:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            return _response(Answer(413, f"the body is larger than {MAX_BODY} bytes\n"))
        body = bytearray()
        with anyio.move_on_after(body_seconds) as reading:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY:
                    return _response(Answer(413, f"the body is larger than {MAX_BODY} bytes\n"))
        if reading.cancelled_caught:  # a slow-loris body does not hold the witness
            return _response(Answer(408, f"the body took more than {body_seconds:g} seconds\n"))
        return _response(await run_in_threadpool(witness.add_checkpoint, bytes(body)))

    async def checkpoint(request: Request) -> Response:
        origin_hash = str(request.path_params["origin_hash"])
        return _response(await run_in_threadpool(witness.checkpoint, origin_hash))

    return Starlette(
        routes=[
            Route("/add-checkpoint", add_checkpoint, methods=["POST"]),
            Route("/{origin_hash}/checkpoint", checkpoint, methods=["GET"]),
        ]
    )
