"""POST /v1/responses: OpenAI's Responses API, its text generation, over the chat path.

A request becomes a chat request (ChatCompletionRequest) and goes the chat way: the chat
template, the sampling params and their defaults, the context checks, the engine client
(serving.py). `instructions` is a system message before the input's messages; a string input
is one user message. The answer is a Response: one output item, an assistant message with one
output_text part; status "completed", or "incomplete" with incomplete_details {"reason":
"max_output_tokens"} where the reply was cut by length (max_output_tokens, or the context's
end). Under --reasoning-parser a reply's thinking is a reasoning item before the message (its
text in content[0], as vLLM answers it), and the message holds the rest.

Function tools are chat's (serving._tool_options and its rules, the tool-call parsers): the flat
{"type": "function", "name", "description", "parameters", "strict"} tools become chat's nested
ones, tool_choice {"type": "function", "name"} chat's named function ("auto" needs
--enable-auto-tool-choice and --tool-call-parser; "required" and a named function force the
reply by structured output), parallel_tool_calls chat's. Each call the reply makes is a
function_call item {"id": "fc_...", "call_id", "name", "arguments", "status"} (the response's
status) after the message, which is left out where it would be empty. Input function_call items are
the assistant's tool_calls (joining the assistant message right before them) and
function_call_output items chat's tool messages, so that a second turn renders as chat's does.
Other tool types (web_search, file_search, mcp, ...) and their tool_choice are 400s naming them.

include ["message.output_text.logprobs"] (with top_logprobs) is chat's logprobs=true (with its
top_logprobs): the reply's tokens' logprobs, in chat's entries (token, logprob, bytes,
top_logprobs), on the output_text part; streamed, each output_text.delta carries those of the
tokens since the last one, the last delta (its text "" where the rest was a stop string) the
remaining ones, and output_text.done all. A reply that a parser splits (--reasoning-parser, a
tool choice read for calls) is refused (a 400 naming include): its tokens are not all the text's.

Streamed, the events are OpenAI's, each an SSE `event:` line and its `data:` with a
sequence_number from 0: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta (one per engine output with new text;
text that may become a stop string is held back, as in chat), response.output_text.done,
response.content_part.done, response.output_item.done, response.completed (whose response has
the final status, "incomplete" included, as vLLM ends every stream, so that the openai client's
responses.stream(...) helper has its final response). A reasoning item, where there is one, is
sent whole (added and done) before the message's item. Each function_call item follows the
message's done (or stands alone where the message is left out): response.output_item.added
(arguments ""), response.function_call_arguments.delta (all of them: a call settles whole),
response.function_call_arguments.done, response.output_item.done; all calls are sent at the
reply's end, so the items come in the full response's order. An engine error after the stream began
is an "error" event (code, message, param), and the stream ends there.

Nothing is stored (vLLM's default, which stores only under VLLM_ENABLE_RESPONSES_API_STORE):
store=true is served, and the response says `store: false`; previous_response_id is a 400 and
GET /v1/responses/{id} a 404. Fields this server does not implement (reasoning, background,
other include values, max_tool_calls, ...) are 400s naming them (protocol._RESPONSES_UNSUPPORTED).
"""

from __future__ import annotations

import json
import uuid
from typing import AsyncIterator, Optional

from enginespec.entrypoints.openai import serving
from enginespec.entrypoints.openai.errors import APIError
from enginespec.entrypoints.openai.protocol import OUTPUT_LOGPROBS, ChatCompletionRequest, ResponsesRequest
from enginespec.entrypoints.openai.reasoning import ReasoningStream
from enginespec.entrypoints.openai.serving import ServerContext, _Call, _Choice
from enginespec.entrypoints.openai.sse import frame
from enginespec.spec import SamplingParams

_ROLES = ("user", "system", "developer", "assistant")
_MESSAGE_KEYS = {"type", "role", "content", "id", "status"}
_FUNCTION_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
_FUNCTION_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}
_FUNCTION_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
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
        call, tools = _chat_call(ctx, chat, f"resp_{serving._base_id(chat, header_id)}")
        _check_logprobs(call)
        logprobs = (chat.top_logprobs or 0) if chat.logprobs else None
        params = serving._tool_params(ctx, call, serving._params(call, chat.max_tokens, logprobs, ctx), tools)
        params = serving._reasoning_params(ctx, call, params)
        gen = await serving._submit(ctx, call, params)
    except APIError as err:
        raise _renamed(err) from None
    if body.stream:
        return _stream(call, gen, body, params, ctx)
    try:
        await serving._collect(call.finals, gen, wait_disconnect)
    finally:
        gen.abort()
    serving._log_outputs(ctx, call)
    (out,) = call.finals.values()
    return _full_response(call, body, params, out, ctx)


def _renamed(err: APIError) -> APIError:
    """err under the Responses API's name of its field (max_output_tokens, input): its param,
    and where the message quotes max_tokens, the message too; a message that names chat's
    response_format (a forced tool_choice refused with it) names text.format."""
    name = _RENAMED.get(err.param)
    message = err.message.replace("response_format", "text.format")
    if name == "max_output_tokens":
        message = message.replace("SamplingParams.max_tokens", name).replace(f"'{err.param}'", f"'{name}'")
    return APIError(err.status, message, name or err.param, err.retry_after)


def _check_logprobs(call: _Call) -> None:
    """The output text's logprobs (include "message.output_text.logprobs") are the reply's tokens'
    and go on its one output_text part: a 400 naming include where the reply is split (under
    --reasoning-parser, or read for tool calls), whose tokens are not all that text's; top_logprobs
    needs them asked (chat's rule for its logprobs)."""
    body = call.body
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, f'top_logprobs needs include ["{OUTPUT_LOGPROBS}"]', "top_logprobs")
    if body.logprobs and (call.reasoning is not None or call.tool_parsing):
        split = "--reasoning-parser" if call.reasoning is not None else "tools"
        raise APIError(400, f"include {OUTPUT_LOGPROBS!r} is not supported with {split}: the reply's tokens are not all the output text's", "include")  # fmt: skip  # noqa: E501


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
    (a string: one user message; a list: its items, in order, a function_call joining the
    assistant message right before it, so that one turn's text and calls are one message)."""
    messages = [] if body.instructions is None else [{"role": "system", "content": body.instructions}]
    if isinstance(body.input, str):
        return messages + [{"role": "user", "content": body.input}]
    if not body.input:
        raise APIError(400, "input must not be an empty list", "input")
    for i, item in enumerate(body.input):
        message = _input_message(item, i)
        last = messages[-1] if messages else None
        if "tool_calls" in message and last is not None and last["role"] == "assistant":
            last["tool_calls"] = [*last.get("tool_calls", []), *message["tool_calls"]]
        else:
            messages.append(message)
    return messages


def _input_message(item: dict, index: int) -> dict:
    """One input item as a chat message: a message item ({"role", "content"}, "type" "message"
    or none; an earlier response's output message, with its id and status, too), a function_call
    (an assistant's tool call) or a function_call_output (the tool message). Any other item
    (reasoning, item references, hosted tools' calls) is a 400 naming input."""
    where = f"input[{index}]"
    kind = item.get("type", "message")
    if kind == "function_call":
        return _function_call_message(item, where)
    if kind == "function_call_output":
        return _tool_message(item, where)
    if kind != "message":
        raise APIError(400, f"{where}: items of type {kind!r} are not supported by this server (only message, function_call and function_call_output items)", "input")  # fmt: skip  # noqa: E501
    extra = sorted(set(item) - _MESSAGE_KEYS)
    if extra:
        raise APIError(400, f"{where}: a message item has no field(s) {extra}", "input")
    if item.get("role") not in _ROLES:
        raise APIError(400, f"{where}.role must be one of {list(_ROLES)}, got {item.get('role')!r}", "input")
    content = item.get("content")
    if not isinstance(content, (str, list)):
        raise APIError(400, f"{where}.content must be a string or a list of content parts", "input")
    return {"role": item["role"], "content": content}


def _item_fields(item: dict, where: str, allowed: set, strings: tuple) -> None:
    """A 400 naming input where the item has a field it may not, or one of `strings` is not a
    non-empty string."""
    extra = sorted(set(item) - allowed)
    if extra:
        raise APIError(400, f"{where}: a {item['type']} item has no field(s) {extra}", "input")
    for name in strings:
        if not (isinstance(item.get(name), str) and item[name]):
            raise APIError(400, f"{where}.{name} must be a non-empty string, got {item.get(name)!r}", "input")


def _function_call_message(item: dict, where: str) -> dict:
    """A function_call item as the chat assistant message of that one tool call (its call_id
    the call's id, which the tool message's tool_call_id names); arguments must be JSON object
    text, as chat's tool calls' are."""
    _item_fields(item, where, _FUNCTION_CALL_KEYS, ("call_id", "name"))
    arguments = item.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise APIError(400, f"{where}.arguments must be a JSON object as text, got {arguments!r}", "input")
    function = {"name": item["name"], "arguments": arguments}
    call = {"id": item["call_id"], "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _tool_message(item: dict, where: str) -> dict:
    """A function_call_output item as chat's tool message: its output (a string, or a list of
    content parts) the content, its call_id the tool_call_id."""
    _item_fields(item, where, _FUNCTION_OUTPUT_KEYS, ("call_id",))
    output = item.get("output")
    if not isinstance(output, (str, list)):
        raise APIError(400, f"{where}.output must be a string or a list of content parts", "input")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _chat_tools(tools) -> Optional[list]:
    """Responses' function tools ({"type": "function", "name", "description"?, "parameters"?,
    "strict"?}) as chat's ({"type": "function", "function": {...}}); None where there are none
    (null or [], which ask for nothing). Any other tool type (web_search, file_search, mcp, ...)
    is a 400 naming tools and the type."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise APIError(400, f"tools must be a list of function tools, got {type(tools).__name__}", "tools")
    return [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]


def _chat_tool(tool, where: str) -> dict:
    """One Responses function tool as chat's, its fields (those _FUNCTION_TOOL_KEYS names) under
    "function"; a 400 naming tools where it is another type, or its name or parameters are bad."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise APIError(400, f"{where}: tools of type {kind!r} are not supported by this server (only function tools)", "tools")  # fmt: skip  # noqa: E501
    extra = sorted(set(tool) - _FUNCTION_TOOL_KEYS)
    if extra:
        raise APIError(400, f"{where}: a function tool has no field(s) {extra} here", "tools")
    if not (isinstance(tool.get("name"), str) and tool["name"]):
        raise APIError(400, f"{where}.name must be a non-empty string, got {tool.get('name')!r}", "tools")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise APIError(400, f"{where}.parameters must be a JSON schema object, got {tool['parameters']!r}", "tools")  # fmt: skip  # noqa: E501
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _chat_tool_choice(choice, has_tools: bool):
    """tool_choice in chat's form: "none", "auto" and "required" as they are (null, "none" or
    "auto" without tools: unset, since they ask for nothing), {"type": "function", "name"} as
    chat's named function. A hosted tool's choice or allowed_tools is a 400 naming tool_choice."""
    if choice is None or (choice in ("none", "auto") and not has_tools):
        return None
    if not isinstance(choice, dict):
        return choice  # chat's _tool_options checks the value
    name = choice.get("name")
    if choice.get("type") != "function" or set(choice) != {"type", "name"} or not isinstance(name, str):
        raise APIError(400, f'tool_choice {choice!r} is not supported by this server (only "none", "auto", "required" or {{"type": "function", "name": ...}})', "tool_choice")  # fmt: skip  # noqa: E501
    return {"type": "function", "function": {"name": name}}


def _as_chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that serves body: its messages, sampling fields, output format and
    function tools."""
    tools = _chat_tools(body.tools)
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
        logprobs=body.include_logprobs,
        top_logprobs=body.top_logprobs,
        tools=tools,
        tool_choice=_chat_tool_choice(body.tool_choice, tools is not None),
        parallel_tool_calls=body.parallel_tool_calls,
    )


def _chat_call(
    ctx: ServerContext, chat: ChatCompletionRequest, response_id: str
) -> tuple[_Call, Optional[list]]:
    """The chat call of the request and the tools its template shows, as create_chat_completion
    sets them up (no echo): the tool choice (chat's rules), the rendered prompt, the served
    model's name, the reasoning split under --reasoning-parser."""
    tools, tool_mode, forced_name = serving._tool_options(ctx, chat)
    text = serving.render_chat(ctx, chat, tools)
    prompts = [(text, serving._encode(ctx, text, add_special_tokens=chat.add_special_tokens))]
    model = chat.model or ctx.model_names[0]
    call = _Call("chat", response_id, model, chat, prompts, serving._stops(chat))
    serving.set_tool_mode(ctx, call, tool_mode, forced_name)
    if ctx.reasoning_parser is not None:
        call.reasoning = ctx.reasoning_parser
        call.starts_in_reasoning = call.reasoning.starts_in_reasoning(
            text, serving.template_kwargs(ctx, chat)
        )
    return call, tools


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
        "tools": body.tools or [],
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


def _message_item(item_id: str, text: str, status: str, logprobs: Optional[list] = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
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


def _function_call_item(tool_call: dict, status: str) -> dict:
    """A parsed tool call (chat's tool call object, serving._tool_call_json) as a function_call
    output item: its call_id the chat call's id (vLLM's form for the server's parser, which a
    second turn's template takes back), its id a fresh fc_ one; its status the response's
    ("incomplete" where the reply was cut: a forced function's arguments may be cut short)."""
    function = tool_call["function"]
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": tool_call["id"],
        "name": function["name"],
        "arguments": function["arguments"],
        "status": status,
    }


def _output_items(call: _Call, reasoning: str, message: Optional[dict], calls: list[dict]) -> list[dict]:
    """A response's output, in this order: the reasoning item (where the reply thought), the
    message item (where it has content, or where there is nothing else), the function_call
    items."""
    items = [_reasoning_item(call, reasoning)] if reasoning else []
    if message is not None and (message["content"][0]["text"] or not calls):
        items.append(message)
    return items + calls


def _output_logprobs(ctx: Optional[ServerContext], call: _Call, token_ids, logprobs) -> list:
    """The tokens' logprobs in the output_text part's form (chat's logprobs content: token,
    logprob, bytes, top_logprobs); [] where none were asked."""
    if logprobs is None or not call.body.logprobs:
        return []
    return serving._logprobs(ctx, call, token_ids, logprobs)["content"]


def _full_response(
    call: _Call, body: ResponsesRequest, params: SamplingParams, out, ctx: Optional[ServerContext] = None
) -> dict:
    """The Response of a finished reply, split by chat's parsers (serving._message: reasoning,
    content and tool calls, parallel_tool_calls false keeping the first); asked, the logprobs of
    all its tokens on the output text."""
    completion = out.outputs[0]
    status = _status(completion.finish_reason)
    chat_message = serving._message(call, completion.text)
    lps = _output_logprobs(ctx, call, completion.token_ids, completion.logprobs)
    message = _message_item(f"msg_{call.engine_id}", chat_message["content"] or "", status, lps)
    calls = [_function_call_item(c, status) for c in chat_message.get("tool_calls", [])]
    response = _response(call, body, params, status)
    response["output"] = _output_items(call, chat_message.get("reasoning") or "", message, calls)
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
    """The events of one reply: the reasoning item, sent whole where the reply thinks first, as
    its content begins (or at the end); the message item, open from the first content (at the
    end where there is none and no call) and closed at the end; then a function_call item per
    call the tool-call reader settled (chat's, _Call.tool_stream), each sent whole at the end,
    so that the items come in the full response's order (_output_items) whatever the parser
    settles when. Asked, each text delta carries the logprobs of the tokens since the last one."""

    def __init__(self, call: _Call, events: _Events, ctx: Optional[ServerContext] = None) -> None:
        self.call, self.events, self.ctx = call, events, ctx
        self.item_id = f"msg_{call.engine_id}"
        self.state = _Choice()
        self.reasoning_stream = ReasoningStream(call.starts_in_reasoning) if call.reasoning else None
        self.tool_stream = call.tool_stream() if call.tool_parsing else None
        self.reasoning = self.text = ""
        self.tool_calls: list[dict] = []  # the calls settled so far (chat's tool call objects)
        self.calls: list[dict] = []  # their function_call items, made at the end
        self.num_items = 0  # output items opened
        self.reasoning_sent = self.open = False
        # asked: the logprobs sent (in text deltas) and those of tokens whose text is held back
        self.logprobs: list[dict] = []
        self.pending_logprobs: list[dict] = []

    def feed(self, completion) -> list[str]:
        """The events of the completion's new text (finished: up to the response's last item)."""
        finished = completion.finish_reason is not None
        self._new_logprobs(completion)
        delta = _new_text(self.call, self.state, completion)
        content = delta
        if self.reasoning_stream is not None:
            reasoning, content = self.reasoning_stream.feed(delta, final=finished)
            self.reasoning += reasoning
        if self.tool_stream is not None:
            content, calls = self.tool_stream.feed(content, final=finished)
            self._take(calls)
        frames = self._open() if content or (finished and not self.tool_calls) else []
        if content or (finished and self.open and self.pending_logprobs):  # tokens of a stop string
            frames.append(self._text_delta(content))
        if finished:
            frames += self._send_reasoning()
            status = _status(completion.finish_reason)
            frames += self._close(status) if self.open else []
            self.calls = [_function_call_item(c, status) for c in self.tool_calls]
            for item in self.calls:
                frames += self._call_events(item)
        return frames

    def items(self, status: str) -> list[dict]:
        """The output items sent, as the final response lists them."""
        message = _message_item(self.item_id, self.text, status, self.logprobs) if self.open else None
        return _output_items(self.call, self.reasoning, message, self.calls)

    def _new_logprobs(self, completion) -> None:
        """Keeps the new tokens' logprobs (asked) until a text delta carries them."""
        if completion.logprobs is None or not self.call.body.logprobs:
            return
        start, self.state.num_tokens = self.state.num_tokens, len(completion.token_ids)
        new = completion.token_ids[start:], completion.logprobs[start:]
        self.pending_logprobs += _output_logprobs(self.ctx, self.call, *new)

    def _text_delta(self, content: str) -> str:
        """The output_text.delta event of new content, with the logprobs of the tokens since the
        last one (so that the deltas' logprobs add up to the full response's)."""
        self.text += content
        lps, self.pending_logprobs = self.pending_logprobs, []
        self.logprobs += lps
        return self._part_event("response.output_text.delta", delta=content, logprobs=lps)

    def _take(self, calls: list) -> None:
        """Keeps the settled calls (parallel_tool_calls false: the first only)."""
        if self.call.single_tool_call:
            calls = calls[: max(0, 1 - len(self.tool_calls))]
        self.tool_calls += [serving._tool_call_json(c, self.call.tool_parser) for c in calls]

    def _part_event(self, kind: str, **fields) -> str:
        where = dict(item_id=self.item_id, output_index=self.num_items - 1, content_index=0)
        return self.events(kind, **where, **fields)

    def _send_reasoning(self) -> list[str]:
        """The reasoning item, added and done at once, the first time there is reasoning to send."""
        if self.reasoning_sent or not self.reasoning:
            return []
        self.reasoning_sent = True
        item = _reasoning_item(self.call, self.reasoning)
        index = self.num_items
        self.num_items += 1
        return [
            self.events("response.output_item.added", output_index=index, item=item),
            self.events("response.output_item.done", output_index=index, item=item),
        ]

    def _open(self) -> list[str]:
        if self.open:
            return []
        self.open = True
        frames = self._send_reasoning()
        item = {**_message_item(self.item_id, "", "in_progress"), "content": []}
        frames.append(self.events("response.output_item.added", output_index=self.num_items, item=item))
        self.num_items += 1
        part = _message_item(self.item_id, "", "in_progress")["content"][0]
        frames.append(self._part_event("response.content_part.added", part=part))
        return frames

    def _close(self, status: str) -> list[str]:
        item = _message_item(self.item_id, self.text, status, self.logprobs)
        return [
            self._part_event("response.output_text.done", text=self.text, logprobs=self.logprobs),
            self._part_event("response.content_part.done", part=item["content"][0]),
            self.events("response.output_item.done", output_index=self.num_items - 1, item=item),
        ]

    def _call_events(self, item: dict) -> list[str]:
        """A function_call item's events, as OpenAI sends them: added (no arguments yet), the
        arguments (one delta, since a call settles whole), their done, the item's done."""
        index = self.num_items
        self.num_items += 1
        where = dict(item_id=item["id"], output_index=index)
        added = {**item, "arguments": "", "status": "in_progress"}
        return [
            self.events("response.output_item.added", output_index=index, item=added),
            self.events("response.function_call_arguments.delta", **where, delta=item["arguments"]),
            self.events("response.function_call_arguments.done", **where, arguments=item["arguments"]),
            self.events("response.output_item.done", output_index=index, item=item),
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


async def _stream(
    call: _Call, gen, body: ResponsesRequest, params: SamplingParams, ctx: ServerContext
) -> AsyncIterator[str]:
    """The SSE events of a streamed response (the module's docstring gives their order)."""
    events = _Events()
    message = _MessageStream(call, events, ctx)
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
