"""POST /v1/responses: OpenAI's Responses API, its text generation, over the chat path.

A request becomes a chat request (ChatCompletionRequest) and goes the chat way: the chat
template, the sampling params and their defaults, the context checks, the engine client
(serving.py). `instructions` is a system message before the input's messages; a string input
is one user message. The answer is a Response: one output item, an assistant message with one
output_text part; status "completed", or "incomplete" with incomplete_details {"reason":
"max_output_tokens"} where the reply was cut by length (max_output_tokens, or the context's
end). Under --reasoning-parser a reply's thinking is a reasoning item before the message (its
text in content[0], as vLLM answers it), and the message holds the rest.

Streamed, the events are OpenAI's, each an SSE `event:` line and its `data:` with a
sequence_number from 0: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta (one per engine output with new text;
text that may become a stop string is held back, as in chat), response.output_text.done,
response.content_part.done, response.output_item.done, response.completed (whose response has
the final status, "incomplete" included, as vLLM ends every stream, so that the openai client's
responses.stream(...) helper has its final response). A reasoning item, where there is one, is
sent whole (added and done) before the message's item. An engine error after the stream began
is an "error" event (code, message, param), and the stream ends there.

Nothing is stored (vLLM's default, which stores only under VLLM_ENABLE_RESPONSES_API_STORE):
store=true is served, and the response says `store: false`; previous_response_id is a 400 and
GET /v1/responses/{id} a 404. Fields this server does not implement (tools, reasoning,
background, ...) are 400s naming them (protocol._RESPONSES_UNSUPPORTED).
"""

from __future__ import annotations

from typing import AsyncIterator, Optional

from enginespec.entrypoints.openai import serving
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import ChatCompletionRequest, ResponsesRequest
from enginespec.entrypoints.openai.reasoning import ReasoningStream
from enginespec.entrypoints.openai.serving import ServerContext, _Call, _Choice
from enginespec.entrypoints.openai.sse import frame
from enginespec.spec import SamplingParams

_ROLES = ("user", "system", "developer", "assistant")
_MESSAGE_KEYS = {"type", "role", "content", "id", "status"}
# chat's names of the fields the Responses API names otherwise (an error's param)
_RENAMED = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text",
}


async def create_response(
    ctx: ServerContext, body: ResponsesRequest, wait_disconnect, header_id: Optional[str] = None
):
    """A Response (dict), or an async iterator of SSE frames when streaming."""
    ctx.check_model(body.model)
    _check_supported(body)
    chat = _as_chat_request(body)
    try:
        serving._check_request(ctx, chat)
        call = _chat_call(ctx, chat, f"resp_{serving._base_id(chat, header_id)}")
        params = serving._reasoning_params(ctx, call, serving._params(call, chat.max_tokens, None, ctx))
        gen = await serving._submit(ctx, call, params)
    except APIError as err:
        raise _renamed(err) from None
    if body.stream:
        return _stream(call, gen, body, params)
    try:
        await serving._collect(call.finals, gen, wait_disconnect)
    finally:
        gen.abort()
    serving._log_outputs(ctx, call)
    (out,) = call.finals.values()
    return _full_response(call, body, params, out)


def _renamed(err: APIError) -> APIError:
    """err under the Responses API's name of its field (max_output_tokens, input): its param,
    and where the message quotes max_tokens, the message too."""
    name = _RENAMED.get(err.param)
    if name is None:
        return err
    message = err.message
    if name == "max_output_tokens":
        message = message.replace("SamplingParams.max_tokens", name).replace(f"'{err.param}'", f"'{name}'")
    return APIError(err.status, message, name, err.retry_after)


def _check_supported(body: ResponsesRequest) -> None:
    """A 400 naming the first field set to something this server does not do."""
    name = body.unsupported_field()
    if name == "text":
        raise APIError(
            400,
            "`text` is not supported by this server beyond text.format of type text, json_object, or "
            'json_schema with "name" and "schema"',
            "text",
        )
    if name == "previous_response_id":
        raise APIError(
            400,
            "`previous_response_id` is not supported by this server: it stores no responses (vLLM's "
            "default), so send the conversation so far in `input`",
            name,
        )
    if name is not None:
        raise APIError(400, f"`{name}` is not supported by this server", name)


def input_messages(body: ResponsesRequest) -> list[dict]:
    """The chat messages of a request: instructions as a system message first, then the input
    (a string: one user message; a list: its message items, in order)."""
    messages = [] if body.instructions is None else [{"role": "system", "content": body.instructions}]
    if isinstance(body.input, str):
        return messages + [{"role": "user", "content": body.input}]
    if not body.input:
        raise APIError(400, "input must not be an empty list", "input")
    return messages + [_input_message(item, i) for i, item in enumerate(body.input)]


def _input_message(item: dict, index: int) -> dict:
    """One input item as a chat message: a message item ({"role", "content"}, "type" "message"
    or none; an earlier response's output message, with its id and status, too). Any other item
    (function calls and their outputs, reasoning, item references) is a 400 naming input."""
    where = f"input[{index}]"
    kind = item.get("type", "message")
    if kind != "message":
        raise APIError(400, f"{where}: items of type {kind!r} are not supported by this server (only message items)", "input")  # fmt: skip  # noqa: E501
    extra = sorted(set(item) - _MESSAGE_KEYS)
    if extra:
        raise APIError(400, f"{where}: a message item has no field(s) {extra}", "input")
    if item.get("role") not in _ROLES:
        raise APIError(400, f"{where}.role must be one of {list(_ROLES)}, got {item.get('role')!r}", "input")
    content = item.get("content")
    if not isinstance(content, (str, list)):
        raise APIError(400, f"{where}.content must be a string or a list of content parts", "input")
    return {"role": item["role"], "content": content}


def _as_chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that serves body: its messages, sampling fields and output format."""
    return ChatCompletionRequest(
        model=body.model,
        messages=input_messages(body),
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=body.stream,
        user=body.user,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        stop=body.stop,
        ignore_eos=body.ignore_eos,
        priority=body.priority,
        cache_salt=body.cache_salt,
        request_id=body.request_id,
        response_format=body.text_format(),
    )


def _chat_call(ctx: ServerContext, chat: ChatCompletionRequest, response_id: str) -> _Call:
    """The chat call of the request, as create_chat_completion sets it up (no tools, no echo):
    the rendered prompt, the served model's name, the reasoning split under --reasoning-parser."""
    text = serving.render_chat(ctx, chat)
    prompts = [(text, serving._encode(ctx, text, add_special_tokens=chat.add_special_tokens))]
    model = chat.model or ctx.model_names[0]
    call = _Call("chat", response_id, model, chat, prompts, serving._stops(chat))
    if ctx.reasoning_parser is not None:
        call.reasoning = ctx.reasoning_parser
        call.starts_in_reasoning = call.reasoning.starts_in_reasoning(
            text, serving.template_kwargs(ctx, chat)
        )
    return call


# ---- the Response object ------------------------------------------------------------------------


def _status(finish_reason: Optional[str]) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _response(call: _Call, body: ResponsesRequest, params: SamplingParams, status: str) -> dict:
    """The Response object of the call without output and usage (set by the caller): what it
    was asked, with the sampling values the engine used (defaults resolved)."""
    return {
        "id": call.response_id,
        "object": "response",
        "created_at": call.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "model": call.model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": params.temperature,
        "text": body.text if body.text is not None else {"format": {"type": "text"}},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": [],
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "background": False,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
    }


def _usage(call: _Call, out) -> dict:
    """The Responses API's usage: cached_tokens the prompt tokens the prefix cache served;
    cache_write_tokens and reasoning_tokens 0 (counts this server does not keep: OpenAI's
    billing of cache writes; under --reasoning-parser the thinking is split by text, not by
    token). output_tokens counts every generated token, thinking included."""
    num_input = len(call.prompts[0][1])
    num_output = len(out.outputs[0].token_ids)
    return {
        "input_tokens": num_input,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens": num_output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": num_input + num_output,
    }


def _message_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def _reasoning_item(call: _Call, text: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}]
    return {
        "id": f"rs_{call.engine_id}",
        "type": "reasoning",
        "summary": [],
        "content": content,
        "status": None,
    }


def _split(call: _Call, text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole reply ("" reasoning without --reasoning-parser)."""
    if call.reasoning is None:
        return "", text
    reasoning, content = call.reasoning.split(text, call.starts_in_reasoning)
    return reasoning or "", content or ""


def _full_response(call: _Call, body: ResponsesRequest, params: SamplingParams, out) -> dict:
    completion = out.outputs[0]
    status = _status(completion.finish_reason)
    reasoning, content = _split(call, completion.text)
    response = _response(call, body, params, status)
    if reasoning:
        response["output"].append(_reasoning_item(call, reasoning))
    response["output"].append(_message_item(f"msg_{call.engine_id}", content, status))
    response["usage"] = _usage(call, out)
    return response


# ---- streaming ----------------------------------------------------------------------------------


class _Events:
    """The stream's events, numbered in order (sequence_number from 0)."""

    def __init__(self) -> None:
        self.num_sent = 0

    def __call__(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.num_sent, **fields}
        self.num_sent += 1
        return f"event: {kind}\n{frame(payload)}"


class _MessageStream:
    """The events of one reply: the message item opens on the first content (after the reasoning
    item, sent whole, where the reply thinks first) or at the end, whichever comes first."""

    def __init__(self, call: _Call, events: _Events) -> None:
        self.call, self.events = call, events
        self.item_id = f"msg_{call.engine_id}"
        self.state = _Choice()
        self.reasoning_stream = ReasoningStream(call.starts_in_reasoning) if call.reasoning else None
        self.reasoning = self.text = ""
        self.num_items = 0  # output items opened
        self.open = False

    def feed(self, completion) -> list[str]:
        """The events of the completion's new text (finished: up to its message's end)."""
        finished = completion.finish_reason is not None
        delta = _new_text(self.call, self.state, completion)
        content = delta
        if self.reasoning_stream is not None:
            reasoning, content = self.reasoning_stream.feed(delta, final=finished)
            self.reasoning += reasoning
        frames = self._open() if content or finished else []
        if content:
            self.text += content
            frames.append(self._part_event("response.output_text.delta", delta=content, logprobs=[]))
        if finished:
            frames += self._close(_status(completion.finish_reason))
        return frames

    def items(self, status: str) -> list[dict]:
        """The output items sent, as the final response lists them."""
        items = [_reasoning_item(self.call, self.reasoning)] if self.reasoning else []
        return items + [_message_item(self.item_id, self.text, status)]

    def _part_event(self, kind: str, **fields) -> str:
        where = dict(item_id=self.item_id, output_index=self.num_items - 1, content_index=0)
        return self.events(kind, **where, **fields)

    def _open(self) -> list[str]:
        if self.open:
            return []
        self.open, frames = True, []
        if self.reasoning:
            item = _reasoning_item(self.call, self.reasoning)
            frames.append(self.events("response.output_item.added", output_index=0, item=item))
            frames.append(self.events("response.output_item.done", output_index=0, item=item))
            self.num_items += 1
        item = {**_message_item(self.item_id, "", "in_progress"), "content": []}
        frames.append(self.events("response.output_item.added", output_index=self.num_items, item=item))
        self.num_items += 1
        part = _message_item(self.item_id, "", "in_progress")["content"][0]
        frames.append(self._part_event("response.content_part.added", part=part))
        return frames

    def _close(self, status: str) -> list[str]:
        item = _message_item(self.item_id, self.text, status)
        return [
            self._part_event("response.output_text.done", text=self.text, logprobs=[]),
            self._part_event("response.content_part.done", part=item["content"][0]),
            self.events("response.output_item.done", output_index=self.num_items - 1, item=item),
        ]


def _new_text(call: _Call, state: _Choice, completion) -> str:
    """The completion's text that is new since the last delta. While it runs, a tail that may
    still become a stop string is held back (serving._held_back), so no delta is retracted."""
    text = completion.text
    end = len(text)
    if completion.finish_reason is None and call.stops:
        end -= serving._held_back(state, text, call.stops)
    end = max(end, state.num_chars)
    delta = text[state.num_chars : end]
    state.num_chars = end
    return delta


async def _stream(call: _Call, gen, body: ResponsesRequest, params: SamplingParams) -> AsyncIterator[str]:
    """The SSE events of a streamed response (the module's docstring gives their order)."""
    events = _Events()
    message = _MessageStream(call, events)
    try:
        started = _response(call, body, params, "in_progress")
        yield events("response.created", response=started)
        yield events("response.in_progress", response=started)
        out = None
        while not gen.done:
            try:
                latest = _latest(await gen.next())
            except APIError as err:
                yield events("error", code=str(err.status), message=err.message, param=err.param)
                return
            if latest is not None:
                out = latest
                for event in message.feed(out.outputs[0]):
                    yield event
        status = _status(out.outputs[0].finish_reason)
        final = {**_response(call, body, params, status), "output": message.items(status)}
        final["usage"] = _usage(call, out)
        yield events("response.completed", response=final)
    finally:
        gen.abort()  # the client left (or the server is stopping): free the blocks now


def _latest(items: list):
    """The request's newest output among the items of one Generation.next(); an engine error,
    or a reply the engine failed, as an APIError."""
    if items and items[0][0] == "error":
        raise serving._as_api_error(items[0][1])
    out = None
    for _, payload in items:
        serving._raise_if_failed(payload)
        out = payload
    return out
