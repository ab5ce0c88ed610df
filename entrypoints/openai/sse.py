"""Server-sent events: `data: {json}\\n\\n` frames, then `data: [DONE]\\n\\n`.

SSEResponse always watches for the client's disconnect while it streams (starlette does so only
for servers of ASGI spec < 2.4; otherwise it notices a gone client at its next write, which for
a request still waiting in the queue may be never). On disconnect the body iterator is cancelled,
and its `finally` aborts the engine requests. The iterator is closed whenever the response ends,
so that its `finally` runs then: a disconnect seen while a write waited (a client that stopped
reading) cancels the write, outside the iterator, which was left suspended until the garbage
collector reached it, its engine requests generating for nobody meanwhile.
"""

from __future__ import annotations

import json

import anyio
from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"


# One encoder for every frame: json.dumps with non-default arguments builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def frame(payload: dict) -> str:
    return f"data: {_encode(payload)}\n\n"


def encode_json(payload) -> str:
    """Compact JSON, exactly as frame() renders the same value inside a frame."""
    return _encode(payload)


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content, **kwargs):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type=self.media_type, headers=headers, **kwargs)

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-write
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:  # an async generator (a finished one closes as a no-op)
                await aclose()
