"""vLLM's error shape: {"error": {"message", "type", "param", "code"}}, code = the HTTP status.

APIError carries status and type; handlers raise it and the app turns it into a JSONResponse.
Inside a stream that has already started, the same body goes out as one `data:` frame.
"""

from __future__ import annotations

from typing import Optional

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error answered to the client: status (400, 401, 404, 409, 500, 503), message, param."""

    def __init__(
        self, status: int, message: str, param: Optional[str] = None, retry_after: Optional[int] = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: Optional[str] = None) -> dict:
    return {
        "error": {"message": message, "type": _TYPES.get(status, "Error"), "param": param, "code": status}
    }


def bad_request(exc: Exception) -> APIError:
    """A ValueError from the spec or the engine: its text names the field; param guessed from it."""
    message = str(exc)
    param = None
    if message.startswith("SamplingParams."):
        param = message.split(" ", 1)[0].split(".", 1)[1].rstrip(":")
    return APIError(400, message, param)
