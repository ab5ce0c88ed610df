"""Completions and chat completions over the engine client: prompts in, OpenAI bodies out.

A request becomes one engine request per prompt (a completions batch has several); choice
index = prompt index * n + sample index, as vLLM numbers them. Streaming sends, per choice,
the text and token ids that are new since its last frame. The engine's cumulative text of a
sample with stop strings may end in a tail that a later token turns into a stop string (and so
cuts away); that tail is held back until it can no longer become one, so streamed text is never
retracted and the concatenated deltas equal the final text.

A body with use_beam_search runs vLLM's beam search instead (_beam_search; serving_beam.py states
the rules): one batch of one-token engine requests a step, its best beams the choices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _escape  # what JSONEncoder(ensure_ascii) uses
from typing import AsyncIterator, Optional, Union

from enginespec import chat_utils
from enginespec.beam_search import run_beam_search_async
from enginespec.chat_utils import ChatTemplateError, resolve_chat_template
from enginespec.engine.core_messages import NewRequest
from enginespec.engine.detokenizer import StopPrefixes
from enginespec.engine.output_processor import ERROR
from enginespec.entrypoints.openai import serving_beam
from enginespec.entrypoints.openai.engine_client import (
    EngineAsleep,
    EngineClient,
    EngineRequestError,
    Generation,
    QueueFull,
    RequestTooLarge,
    ServerShuttingDown,
)
from enginespec.entrypoints.openai.errors import APIError, bad_request, error_body
from enginespec.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    _Sampling,
)
from enginespec.entrypoints.openai.reasoning import ReasoningParser, ReasoningStream, end_token_ids
from enginespec.entrypoints.openai.sampling import to_sampling_params
from enginespec.entrypoints.openai.sse import DONE, encode_json, frame
from enginespec.entrypoints.openai.tool_calls import (
    ForcedCallStream,
    ToolCall,
    forced_schema,
)
from enginespec.entrypoints.openai.tool_parsers import ToolStream, new_stream, tool_call_id
from enginespec.spec import SamplingParams, StructuredOutputsParams
from enginespec.spec.params import ALL_LOGPROBS

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
# /v1/completions' max_tokens where the body leaves it unset (OpenAI's and vLLM's default)
COMPLETION_MAX_TOKENS = 16


@dataclass
class ServerContext:
    """What the handlers share: the engine client, the tokenizer, the served names, the chat template."""

    engine: EngineClient
    tokenizer: object
    model_names: list[str]
    max_model_len: int
    chat_template: Optional[str] = None
    # generation_config.json's sampling defaults (SamplingParams names) for unset fields
    sampling_defaults: dict = field(default_factory=dict)
    # --trust-request-chat-template: a request's own chat_template is used (else a 400, as vLLM)
    trust_request_chat_template: bool = False
    # --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (vLLM's flag)
    enable_prompt_tokens_details: bool = False
    # --reasoning-parser: chat replies split into reasoning and content (openai/reasoning.py)
    reasoning_parser: Optional[ReasoningParser] = None
    # --enable-auto-tool-choice with --tool-call-parser: tool_choice "auto" parses replies' tool
    # calls (openai/tool_calls.py)
    enable_auto_tool_choice: bool = False
    tool_call_parser: Optional[str] = None
    # --enable-log-requests: each request logged at INFO as it is submitted (vLLM's flag), its
    # prompt's text and ids cut to max_log_len (None: whole)
    log_requests: bool = False
    max_log_len: Optional[int] = None
    # the checkpoint the server loaded (the model argument): the model cards' `root`, as vLLM's
    model_path: Optional[str] = None
    # vLLM's server-wide body defaults (chat_defaults): the role of a reply to a generation
    # prompt; "token_id:N" logprob tokens where the body leaves return_tokens_as_token_ids
    # unset; a usage chunk at the end of every stream; how messages' content reaches the template
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    force_include_usage: bool = False
    chat_template_content_format: str = "auto"
    # vLLM's frontend flags (api_server.frontend_flags): chat-template variables under every
    # request's own (chat_template_kwargs); tool_choice "none" keeps the tools from the template;
    # each choice's output logged when it finishes (with log_requests), and with log_deltas
    # (vLLM's default: on) each delta a stream sends; GET /tokenizer_info; the stack trace of
    # each error answered logged (log_error_stack)
    default_chat_template_kwargs: Optional[dict] = None
    exclude_tools_when_tool_choice_none: bool = False
    log_outputs: bool = False
    log_deltas: bool = True
    enable_tokenizer_info_endpoint: bool = False
    log_error_stack: bool = False

    def check_model(self, name: Optional[str]) -> None:
        if name and name not in self.model_names:  # "" or null: the served model, as vLLM
            raise APIError(404, f"The model `{name}` does not exist.", "model")

    @functools.cached_property
    def reasoning_end_ids(self) -> Optional[tuple[int, ...]]:
        """The ids of the reasoning parser's end tag where the tokenizer writes it stably
        (reasoning.end_token_ids; None: it does not, or no parser). Asked once per server."""
        if self.reasoning_parser is None or self.tokenizer is None:
            return None
        return end_token_ids(self.tokenizer)


@dataclass
class _Choice:
    """Streaming progress of one choice: what has been sent.

    num_chars counts the text sent; lp_offset the characters of the token texts whose logprobs
    were sent (the text_offset of the next one, as the full body numbers it). They differ while
    text is held back for a stop string: a token's logprobs go out with its id, its text later."""

    num_chars: int = 0
    num_tokens: int = 0
    lp_offset: int = 0
    started: bool = False
    finished: bool = False
    reasoning: Optional[ReasoningStream] = None  # a chat reply's split so far (--reasoning-parser)
    tools: Union[ToolStream, ForcedCallStream, None] = None  # its tool calls so far
    num_calls: int = 0  # tool calls sent
    stop_prefixes: Optional[StopPrefixes] = None  # its text's possible stop string tail (_held_back)


@dataclass
class _Call:
    """One HTTP request in flight: ids, prompts, params and its streaming progress."""

    kind: str  # "completion" or "chat"
    response_id: str  # the id the client sees (its own, if it named one)
    model: str
    body: _Sampling
    prompts: list[tuple[Optional[str], list[int]]]
    stops: tuple[str, ...]
    created: int = field(default_factory=lambda: int(time.time()))
    index_of: dict = field(default_factory=dict)  # engine request id -> prompt index
    choices: dict = field(default_factory=dict)  # choice index -> _Choice
    finals: dict = field(default_factory=dict)  # engine request id -> final RequestOutput
    # base of the engine's request ids: unique per call even where clients reuse an id
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # a chat call under --reasoning-parser: the parser, and whether replies begin in their thinking
    reasoning: Optional[ReasoningParser] = None
    starts_in_reasoning: bool = False
    # how replies are read for tool calls (_tool_options): "none"; "auto" (the tool-call
    # parser's blocks); "required" or "named" (the reply follows tool_calls.forced_schema)
    tool_mode: str = "none"
    forced_name: Optional[str] = None  # the function tool_choice names ("named")
    # --tool-call-parser: the format "auto" reads (tool_parsers.PARSERS) and its calls' id form
    tool_parser: str = "hermes"
    single_tool_call: bool = False  # parallel_tool_calls false: the first call only
    chat_echo: str = ""  # a chat reply's echoed lead (_chat_echo): before each choice's content
    role: str = "assistant"  # a chat reply's role (_reply_role)

    @property
    def tool_parsing(self) -> bool:
        return self.tool_mode != "none"

    @functools.cached_property  # read for every streamed choice: the body does not change
    def echo(self) -> bool:
        """A completion whose choices begin with their prompt (serving's "echo" section)."""
        return self.kind == "completion" and bool(self.body.echo)

    @functools.cached_property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: each choice is its prompt alone (the engine draws one token,
        which nobody sees, to get the prompt's logprobs)."""
        return self.echo and self.body.max_tokens == 0

    @property
    def parsed(self) -> bool:
        """Whether chat replies go through a parser (no shortcut for their stream frames)."""
        return self.reasoning is not None or self.tool_parsing

    def tool_stream(self) -> Union[ToolStream, ForcedCallStream]:
        """A new reader of one reply's tool calls (the whole reply: one final feed)."""
        return (
            new_stream(self.tool_parser) if self.tool_mode == "auto" else ForcedCallStream(self.forced_name)
        )

    def finish_reason(self, engine_reason: Optional[str], num_calls: int) -> Optional[str]:
        """A finished chat choice's finish_reason, as vLLM gives it: "tool_calls" where "auto"
        parsed calls, or "required" ones came with a normal stop; a named function's reply
        keeps the engine's (OpenAI's "stop")."""
        if num_calls and (
            self.tool_mode == "auto" or self.tool_mode == "required" and engine_reason == "stop"
        ):
            return "tool_calls"
        return engine_reason


# ---- prompts ------------------------------------------------------------------------------------


def _encode(ctx: ServerContext, text: str, add_special_tokens: bool = True) -> list[int]:
    if ctx.tokenizer is None:
        raise APIError(400, "text prompts need a tokenizer; this server has none (send token ids)", "prompt")
    return list(ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens))


def completion_prompts(
    ctx: ServerContext, prompt, add_special_tokens: bool = True
) -> list[tuple[Optional[str], list[int]]]:
    """(text or None, ids) per prompt of a completions body (a string, ids, or a batch); text
    is encoded with or without the tokenizer's special tokens (BOS, ...) as the body asks."""
    if isinstance(prompt, str):
        return [(prompt, _encode(ctx, prompt, add_special_tokens))]
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [(None, list(prompt))]
    out = []
    for p in prompt:
        out.extend(completion_prompts(ctx, p, add_special_tokens))
    return out


def _truncate(call: _Call, ctx: ServerContext, max_tokens: Optional[int]) -> None:
    """The body's truncate_prompt_tokens k applied to every prompt (vLLM's rule): the last k
    tokens kept, k = -1 meaning all that max_tokens leaves of the context (max_model_len -
    max_tokens, 16 for an unset completion max_tokens, 0 for chat's); a k above that, or 0, is a
    400 naming it."""
    k = call.body.truncate_prompt_tokens
    if k is None:
        return
    asked = (
        max_tokens if max_tokens is not None else (COMPLETION_MAX_TOKENS if call.kind == "completion" else 0)
    )
    room = ctx.max_model_len - asked
    if k == 0 or k > room:
        raise APIError(
            400,
            f"truncate_prompt_tokens={k} must be -1 or in [1, max_model_len - max_tokens = {room}]. "
            f"Please request a smaller truncation size.",
            "truncate_prompt_tokens",
        )
    keep = room if k == -1 else k
    call.prompts = [(text, ids[-keep:]) for text, ids in call.prompts]


def render_chat(
    ctx: ServerContext, body: Union[ChatCompletionRequest, TokenizeRequest], tools: Optional[list] = None
) -> str:
    """The body's conversation as prompt text, by chat_utils.render_chat (the rules LLM.chat
    follows too); each of its errors is a 400 naming its field. The template: the body's
    chat_template (only with --trust-request-chat-template, as vLLM), else --chat-template, else
    the tokenizer's; a 400 without one."""
    if body.chat_template is not None and not ctx.trust_request_chat_template:
        raise APIError(
            400,
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
            "chat_template",
        )
    template = body.chat_template if body.chat_template is not None else ctx.chat_template
    try:
        if ctx.tokenizer is None or resolve_chat_template(ctx.tokenizer, template) is None:
            raise chat_utils.no_chat_template_error(
                "start the server with --chat-template FILE (or use /v1/completions)"
            )
        return chat_utils.render_chat(
            ctx.tokenizer,
            body.messages,
            chat_template=template,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            chat_template_kwargs=template_kwargs(ctx, body),
            tools=tools,
            chat_template_content_format=ctx.chat_template_content_format,
        )
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), exc.param) from None


def template_kwargs(ctx: ServerContext, body: Union[ChatCompletionRequest, TokenizeRequest]):
    """The template's extra variables of a body: --default-chat-template-kwargs', each overridden
    by the body's own of the same name (body.template_kwargs(): chat_template_kwargs over those
    reasoning_effort sets), as vLLM merges them. Without server defaults, or with a body value
    that is no dict (chat_utils refuses it, naming the field), the body's as they are."""
    own = body.template_kwargs()
    if not ctx.default_chat_template_kwargs or not isinstance(own, (dict, type(None))):
        return own
    return {**ctx.default_chat_template_kwargs, **(own or {})}


def log_error_stack(ctx: ServerContext, err: APIError) -> None:
    """--log-error-stack (vLLM's): the stack trace of an error the API answers, any status, at
    ERROR (`err` carries it: where it was raised, and the exception it came from)."""
    if ctx.log_error_stack:
        log.error("error answered %d: %s", err.status, err.message, exc_info=err)


# ---- submitting ---------------------------------------------------------------------------------


def _check_request(ctx: ServerContext, body: _Sampling) -> None:
    """The checks of a body as a whole (SamplingParams checks the sampling fields), as vLLM
    makes them: stream_options that set anything need stream=true ({} and null set nothing);
    a priority other than 0 needs the priority policy (fcfs would ignore it); an OpenAI field
    this server does not implement is refused by name unless its value is a no-op; a stream
    has no frame for prompt logprobs, so prompt_logprobs > 0 with stream=true is refused rather
    than computed and dropped (vLLM's rule, which lets 0 pass); length_penalty, which only the
    beam search reads, is refused without use_beam_search unless 1 (vLLM ignores it there); an
    empty cache_salt is refused, as vLLM refuses it (it would name a tenant of its own, apart
    from the unsalted requests a client sending "" meant to join; LLM.generate refuses it too)."""
    unsupported = body.unsupported_field()
    if unsupported is not None:
        raise APIError(400, f"`{unsupported}` is not supported by this server", unsupported)
    if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
        raise APIError(400, "stream_options can only be set when stream is true", "stream_options")
    if body.stream and body.prompt_logprobs:
        raise APIError(400, "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    if body.cache_salt is not None and not body.cache_salt:
        raise APIError(
            400, "cache_salt must be a non-empty string when given (omit it for no salt)", "cache_salt"
        )
    if body.length_penalty != 1.0 and not body.use_beam_search:
        raise APIError(400, "length_penalty applies only with use_beam_search", "length_penalty")
    if body.priority != 0 and not ctx.engine.priority_scheduling:
        raise APIError(
            400,
            f"priority must be 0 unless the server runs --scheduling-policy priority (this one runs "
            f"fcfs), got {body.priority}",
            "priority",
        )


async def _submit(ctx: ServerContext, call: _Call, params) -> Generation:
    subs = []
    for i, (text, ids) in enumerate(call.prompts):
        rid = call.engine_id if len(call.prompts) == 1 else f"{call.engine_id}-{i}"
        call.index_of[rid] = i
        subs.append(NewRequest(rid, text, ids, params, call.body.priority, call.body.cache_salt))
    if ctx.log_requests:
        for sub in subs:
            _log_request(ctx, call, sub)
    return await _engine_submit(ctx, call, subs, prompt_only=call.echo_only)


def _log_request(ctx: ServerContext, call: _Call, sub: NewRequest) -> None:
    """vLLM's "Received request" line at INFO: the engine's request id and the response id the
    client sees, the prompt's text and ids (each cut to max_log_len), the sampling params."""
    n = ctx.max_log_len
    text = sub.prompt if sub.prompt is None or n is None else sub.prompt[:n]
    ids = sub.prompt_token_ids if n is None else sub.prompt_token_ids[:n]
    log.info(
        "Received request %s (response %s): prompt: %r, params: %s, prompt_token_ids: %s",
        sub.request_id, call.response_id, text, sub.params, ids,
    )  # fmt: skip


async def _engine_submit(
    ctx: ServerContext, call: _Call, subs: list[NewRequest], prompt_only: bool = False
) -> Generation:
    """ctx.engine.submit, its refusals as APIErrors (503 with Retry-After; 503 while the engine
    sleeps; or 400 naming the field); prompt_only: the client is answered the prompts alone
    (EngineClient.submit)."""
    try:
        return await ctx.engine.submit(subs, prompt_only=prompt_only)
    except QueueFull as exc:
        raise APIError(503, str(exc), retry_after=RETRY_AFTER_S) from None
    except ServerShuttingDown as exc:  # the grace ran out while the engine had not accepted it
        raise APIError(503, str(exc)) from None
    except EngineAsleep as exc:  # sleep mode: refused whole until POST /wake_up
        raise APIError(503, str(exc)) from None
    except RequestTooLarge as exc:
        raise _too_large(call, exc) from None
    except ValueError as exc:
        raise _bad_field(call, exc) from None


def _bad_field(call: _Call, exc: ValueError) -> APIError:
    """bad_request under the body's name of the field: chat asks SamplingParams.logprobs as
    top_logprobs, and max_tokens as max_completion_tokens where the body set that one (it wins
    over max_tokens); the engine's prompt_token_ids checks (empty, an id beyond the vocabulary)
    name the body's prompt (messages for chat). Under a forcing tool_choice the constraint is the tools' parameters
    (_forced_params), so a schema the grammar compiler refuses is a 400 naming `tools`; else a
    constraint refused as StructuredOutputsParams.<kind> (a regex or schema that does not compile)
    names the body field that carried it, response_format or structured_outputs (its param was
    None: a client reading error.param could not tell which field to fix)."""
    err = bad_request(exc)
    forced = call.tool_mode in ("required", "named")
    if forced and err.param is None and err.message.startswith("StructuredOutputsParams.json"):
        message = f"tools: the parameters schema that tool_choice forces is refused: {err.message}"
        return APIError(400, message, "tools")
    if err.param is None and err.message.startswith("StructuredOutputsParams."):
        fmt = call.body.response_format
        err.param = "response_format" if fmt is not None and fmt.type != "text" else "structured_outputs"
    if err.param is None and err.message.startswith("prompt_token_ids"):  # the engine's prompt check
        err.param = "messages" if call.kind == "chat" else "prompt"
    elif call.kind == "chat" and err.param == "logprobs":
        err.param = "top_logprobs"
    elif err.param == "max_tokens" and getattr(call.body, "max_completion_tokens", None) is not None:
        err.param = "max_completion_tokens"
    return err


def _too_large(call: _Call, exc: RequestTooLarge) -> APIError:
    """400 naming n (or, with n=1, the prompt count) and the capacity the request exceeds."""
    n, num_prompts = call.body.n, len(call.prompts)
    return APIError(
        400,
        f"{num_prompts} prompt(s) x n={n} = {exc.num_samples} samples, more than this server admits "
        f"at once ({exc.capacity} = --max-num-seqs + --max-waiting-requests)",
        "n" if n > 1 else "prompt",
    )


def _check_context(call: _Call, ctx: ServerContext, max_tokens: Optional[int]) -> None:
    """The front end's context rule (vLLM's and OpenAI's): each prompt must leave room for one
    output token, and a max_tokens the client set must fit beside it in max_model_len; else a
    400 naming the field. (The engine would lower it silently, as vLLM's engine does offline.)
    An unset max_tokens is lowered to that room, so a min_tokens above it is a 400 naming
    min_tokens, as vLLM refuses min_tokens > the max_tokens it derived (the engine would lower
    min_tokens too, and the reply would fall short of it)."""
    limit = ctx.max_model_len
    name = "max_completion_tokens" if getattr(call.body, "max_completion_tokens", None) else "max_tokens"
    for _, ids in call.prompts:
        n = len(ids)
        if n >= limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{n} input tokens, which leaves no room for output.",
                "messages" if call.kind == "chat" else "prompt",
            )
        if max_tokens is not None and n + max_tokens > limit:
            raise APIError(
                400,
                f"'{name}' is too large: {max_tokens}. This model's maximum context length is {limit} "
                f"tokens and your request has {n} input tokens ({max_tokens} > {limit} - {n}).",
                name,
            )
        min_tokens = call.body.min_tokens
        if max_tokens is None and n + min_tokens > limit:
            raise APIError(
                400,
                f"'min_tokens' is too large: {min_tokens}. This model's maximum context length is "
                f"{limit} tokens and your request has {n} input tokens, which leaves {limit - n} for "
                f"output ({min_tokens} > {limit} - {n}).",
                "min_tokens",
            )


def _max_tokens(call: _Call, ctx: ServerContext, max_tokens: Optional[int]) -> int:
    """An unset max_tokens: for a completion COMPLETION_MAX_TOKENS (lowered by the engine where
    the context has less room); for chat what the context leaves after the prompt; either capped
    by generation_config.json's max_new_tokens (vLLM's rule: the least of them). A set one must
    fit (_check_context) the prompts as truncate_prompt_tokens leaves them (_truncate)."""
    _truncate(call, ctx, max_tokens)
    _check_context(call, ctx, max_tokens)
    if max_tokens is None and call.kind == "completion":
        return min(COMPLETION_MAX_TOKENS, ctx.sampling_defaults.get("max_tokens", COMPLETION_MAX_TOKENS))
    if max_tokens is None:
        room = max(1, ctx.max_model_len - len(call.prompts[0][1]))
        return min(room, ctx.sampling_defaults.get("max_tokens", room))
    return max_tokens


def _params(call: _Call, max_tokens: Optional[int], logprobs: Optional[int], ctx: ServerContext):
    """The engine's params of the call (max_tokens resolved by _max_tokens)."""
    max_tokens = _max_tokens(call, ctx, max_tokens)
    defaults = ctx.sampling_defaults
    prompt_logprobs = logprobs if call.echo else None
    try:
        return to_sampling_params(
            call.body,
            max_tokens=max_tokens,
            logprobs=logprobs,
            defaults=defaults,
            prompt_logprobs=prompt_logprobs,
        )
    except ValueError as exc:
        raise _bad_field(call, exc) from None


def _base_id(body: _Sampling, header_id: Optional[str]) -> str:
    """What follows the response id's prefix (vLLM's rule): the X-Request-Id header, else the
    body's request_id, else a fresh uuid. Only the client sees it: the engine's request ids are
    the call's own (_Call.engine_id), so concurrent requests may share one."""
    return header_id or body.request_id or uuid.uuid4().hex


async def create_completion(
    ctx: ServerContext, body: CompletionRequest, wait_disconnect, header_id: Optional[str] = None
):
    """A full completion body (dict), or an async iterator of SSE frames when streaming."""
    ctx.check_model(body.model)
    _check_request(ctx, body)
    prompts = completion_prompts(ctx, body.prompt, body.add_special_tokens)
    call = _Call(
        "completion",
        f"cmpl-{_base_id(body, header_id)}",
        body.model or ctx.model_names[0],
        body,
        prompts,
        _stops(body),
    )
    _check_echo(call)
    if body.use_beam_search:
        return await _beam_search(ctx, call, body.max_tokens, body.logprobs, wait_disconnect)
    params = _params(call, 1 if call.echo_only else body.max_tokens, body.logprobs, ctx)
    gen = await _submit(ctx, call, params)
    return await _respond(ctx, call, gen, wait_disconnect)


async def create_chat_completion(
    ctx: ServerContext, body: ChatCompletionRequest, wait_disconnect, header_id: Optional[str] = None
):
    ctx.check_model(body.model)
    _check_request(ctx, body)
    if body.top_logprobs and not body.logprobs:  # 0 asks for nothing: served, as vLLM does
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    tools, tool_mode, forced_name = _tool_options(ctx, body)
    text = render_chat(ctx, body, tools)
    prompts = [(text, _encode(ctx, text, add_special_tokens=body.add_special_tokens))]
    call = _Call(
        "chat",
        f"chatcmpl-{_base_id(body, header_id)}",
        body.model or ctx.model_names[0],
        body,
        prompts,
        _stops(body),
    )
    if ctx.reasoning_parser is not None:
        call.reasoning = ctx.reasoning_parser
        call.starts_in_reasoning = call.reasoning.starts_in_reasoning(
            text, template_kwargs(ctx, body), continues=body.continue_final_message is True
        )
    set_tool_mode(ctx, call, tool_mode, forced_name)
    call.role = _reply_role(ctx, body)
    call.chat_echo = _chat_echo(body, call.role)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.use_beam_search:
        return await _beam_search(ctx, call, max_tokens, logprobs, wait_disconnect)
    params = _tool_params(ctx, call, _params(call, max_tokens, logprobs, ctx), tools)
    params = _reasoning_params(ctx, call, params)
    gen = await _submit(ctx, call, params)
    return await _respond(ctx, call, gen, wait_disconnect)


def _reasoning_params(ctx: ServerContext, call: _Call, params: SamplingParams) -> SamplingParams:
    """params of a constrained chat call under --reasoning-parser (others as they are): a reply
    that starts in its thinking gets the end tag's ids as its constraint's start marker
    (StructuredOutputsParams.start_after_token_ids), so the model thinks freely and the grammar
    governs what follows `</think>`, which the split makes the content (vLLM's structured
    outputs with reasoning). A reply that starts closed (enable_thinking false) follows the
    grammar from its first token, all content. A marker the client set is kept. Where the
    tokenizer has no stable ids for the tag, the split is switched off instead and the grammar
    governs the whole reply, as before (reasoning.end_token_ids)."""
    so = params.structured_outputs
    if so is None or call.reasoning is None or not call.starts_in_reasoning:
        return params
    if so.start_after_token_ids is not None:
        return params
    ids = ctx.reasoning_end_ids
    if ids is None:
        call.reasoning = None  # the grammar governs the whole reply: it has no thinking to split
        return params
    marked = dataclasses.replace(so, start_after_token_ids=ids)
    return dataclasses.replace(params, structured_outputs=marked)


def _reply_role(ctx: ServerContext, body: ChatCompletionRequest) -> str:
    """The role of a chat call's replies, as vLLM's: --response-role's (default "assistant")
    after a generation prompt; otherwise the client's final message's role (the reply goes on
    from that message, continue_final_message's case among others)."""
    if body.add_generation_prompt:
        return ctx.response_role
    return str(body.messages[-1].get("role", "assistant")) if body.messages else "assistant"


def _chat_echo(body: ChatCompletionRequest, role: str = "assistant") -> str:
    """vLLM's chat echo: with echo true, the last message's text (its content parts joined as
    the template sees them) when that message has the reply's role (_reply_role: always so
    without a generation prompt, where the reply takes that message's role, a user's message
    echoed as a "user" reply as in vLLM); "" otherwise. It leads each choice's content, in the
    full body and in the stream's first delta; usage counts none of it."""
    if not body.echo or not body.messages or body.messages[-1].get("role") != role:
        return ""
    return chat_utils.message_text(body.messages[-1].get("content"))


def _tool_options(
    ctx: ServerContext, body: ChatCompletionRequest
) -> tuple[Optional[list], str, Optional[str]]:
    """(the tools for the template, _Call.tool_mode, the named function), by vLLM's rules:
    tools, when given, is a non-empty list (OpenAI's rule too); tool_choice defaults to "auto"
    when tools are given, and any other than "none" needs tools; "auto" needs
    --enable-auto-tool-choice and --tool-call-parser; "none" still shows the tools to the
    template but parses nothing; "required" and a named function ({"type": "function",
    "function": {"name": ...}}) force the reply by structured outputs (_forced_params), with no
    flag needed, as in vLLM."""
    tools = checked_tools(body.tools)
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and tools is None:
        raise APIError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
    name = _named_function(choice) if isinstance(choice, dict) else None
    if choice not in ("auto", "none", "required") and name is None:
        raise APIError(400, f'tool_choice must be "none", "auto", "required" or a named function, got {choice!r}', "tool_choice")  # fmt: skip  # noqa: E501
    if body.parallel_tool_calls is not None and not isinstance(body.parallel_tool_calls, bool):
        raise APIError(400, f"parallel_tool_calls must be a bool, got {body.parallel_tool_calls!r}", "parallel_tool_calls")  # fmt: skip  # noqa: E501
    if tools is None or choice == "none":
        if ctx.exclude_tools_when_tool_choice_none:  # vLLM's flag: the template sees no tools
            return None, "none", None
        return tools, "none", None
    if name is not None or choice == "required":
        return tools, "named" if name is not None else "required", name
    if not (ctx.enable_auto_tool_choice and ctx.tool_call_parser):
        raise APIError(
            400,
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "tool_choice",
        )
    return tools, "auto", None


def set_tool_mode(ctx: ServerContext, call: _Call, tool_mode: str, forced_name: Optional[str]) -> None:
    """How the call reads its replies for tool calls, as _tool_options chose (a chat call, or a
    Responses call over the chat path): the mode, the named function, the server's parser (its
    calls' id form), and parallel_tool_calls false keeping the first call only."""
    call.tool_mode, call.forced_name = tool_mode, forced_name
    call.tool_parser = ctx.tool_call_parser or call.tool_parser
    call.single_tool_call = call.body.parallel_tool_calls is False


def checked_tools(tools: Optional[list]) -> Optional[list]:
    """A request's function tools, or a 400 naming `tools`: not an empty list (OpenAI's rule
    too), each as chat_utils.check_tools asks."""
    if tools == []:
        raise APIError(
            400, "`tools` must not be an empty array: give at least one tool or leave the field out", "tools"
        )
    try:
        chat_utils.check_tools(tools)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), exc.param) from None
    return tools


def _named_function(choice: dict) -> str:
    """The name in a tool_choice of OpenAI's {"type": "function", "function": {"name": ...}}."""
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type", "function") != "function" or not isinstance(name, str) or not name:
        raise APIError(400, f'a named tool_choice is {{"type": "function", "function": {{"name": ...}}}}, got {choice!r}', "tool_choice")  # fmt: skip  # noqa: E501
    return name


def _tool_params(ctx: ServerContext, call: _Call, params: SamplingParams, tools) -> SamplingParams:
    """params as the call's tool choice needs them: "required" or a named function forces the
    reply (_forced_params); and where the server's tool-call parser reads the reply (tools
    given, tool_choice not "none"), special tokens are decoded, as vLLM's hermes parser asks:
    some checkpoints (Hermes-2-Pro, Hermes-3) mark `<tool_call>` special, and a reply decoded
    without them loses its tags and its calls."""
    if call.tool_mode in ("required", "named"):
        params = _forced_params(params, tools, call.forced_name)
    if _parses_tool_calls(ctx, call):
        params = dataclasses.replace(params, skip_special_tokens=False)
    return params


def _parses_tool_calls(ctx: ServerContext, call: _Call) -> bool:
    """Whether the server's tool-call parser reads the call's reply (tools given, tool_choice not
    "none", --enable-auto-tool-choice with a --tool-call-parser): its text is then decoded with
    special tokens, sampled or beam-searched alike."""
    return call.tool_mode != "none" and ctx.enable_auto_tool_choice and bool(ctx.tool_call_parser)


def _forced_params(params: SamplingParams, tools: list, name: Optional[str]) -> SamplingParams:
    """params with the structured output that forces the reply's calls (forced_schema: a named
    function's arguments, or a "required" array of calls); a 400 naming tool_choice when the
    request constrains its output already or names a function it does not list, naming tools
    when two tools' defs clash (the message names the tools[i] entries)."""
    if params.structured_outputs is not None:
        raise APIError(400, "tool_choice \"required\" or a named function cannot be combined with response_format or structured_outputs", "tool_choice")  # fmt: skip  # noqa: E501
    try:
        schema = forced_schema(tools, name)
    except ValueError as exc:
        raise APIError(400, str(exc), "tools" if str(exc).startswith("tools[") else "tool_choice") from None
    return dataclasses.replace(params, structured_outputs=StructuredOutputsParams(json=schema))


def _stops(body: _Sampling) -> tuple[str, ...]:
    if body.stop is None:
        return ()
    return (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)


async def _respond(ctx, call: _Call, gen: Generation, wait_disconnect):
    if call.body.stream:
        return _stream(ctx, call, gen)
    try:
        await _collect(call.finals, gen, wait_disconnect)
    finally:
        gen.abort()
    _log_outputs(ctx, call)
    return _full_body(ctx, call)


def _log_outputs(ctx: ServerContext, call: _Call, streaming: bool = False) -> None:
    """--enable-log-outputs (with --enable-log-requests), vLLM's "Generated response" line at
    INFO, one a choice once the call has finished: the engine's request id, the response id and
    the choice's index the client sees, its text and token ids (each cut to max_log_len), its
    finish reason; " (streaming complete)" for a stream, as vLLM marks it."""
    if not (ctx.log_outputs and ctx.log_requests):
        return
    n, marker = ctx.max_log_len, " (streaming complete)" if streaming else ""
    for rid, prompt_index in call.index_of.items():
        out = call.finals.get(rid)
        for completion in out.outputs if out is not None else ():
            text = completion.text if n is None else completion.text[:n]
            ids = list(completion.token_ids if n is None else completion.token_ids[:n])
            index = prompt_index * call.body.n + completion.index
            log.info(
                "Generated response %s (response %s, choice %d)%s: output: %r, output_token_ids: %s, finish_reason: %s",
                rid, call.response_id, index, marker, text, ids, completion.finish_reason,
            )  # fmt: skip


def _logs_deltas(ctx: ServerContext) -> bool:
    """--enable-log-deltas, which counts only with --enable-log-outputs (and its
    --enable-log-requests), as vLLM's."""
    return ctx.log_deltas and ctx.log_outputs and ctx.log_requests


def _log_delta(ctx: ServerContext, call: _Call, request_id: str, choice, token_ids) -> None:
    """vLLM's "(streaming delta)" line of one choice's frame, at INFO, beside _log_outputs' line
    (the same ids and cuts): the text the frame sends, a chat's reasoning as "[reasoning: ...]"
    and its tool calls' arguments as "[tool_calls: ...]", as vLLM writes them; a frame that
    sends none of these (a bare finish, a role) is not logged. token_ids: the choice's new ids."""
    if type(choice) is str:
        choice = json.loads(choice)  # _plain_choice_json's text: only when logging
    delta = choice.get("delta") or {}
    parts = [choice.get("text") or "", delta.get("content") or ""]
    if delta.get("reasoning"):
        parts.append(f"[reasoning: {delta['reasoning']}]")
    args = "".join((c.get("function") or {}).get("arguments") or "" for c in delta.get("tool_calls") or ())
    if args:
        parts.append(f"[tool_calls: {args}]")
    text = " ".join(p for p in parts if p)
    if not text:
        return
    n = ctx.max_log_len
    log.info(
        "Generated response %s (response %s, choice %d) (streaming delta): output: %r, output_token_ids: %s, finish_reason: %s",
        request_id, call.response_id, choice["index"], text if n is None else text[:n],
        list(token_ids if n is None else token_ids[:n]), choice.get("finish_reason"),
    )  # fmt: skip


def _stream_choice(ctx: ServerContext, call: _Call, out, completion) -> Union[dict, str, None]:
    """_delta_choice, its delta logged under --enable-log-deltas (_log_delta)."""
    if not _logs_deltas(ctx):
        return _delta_choice(ctx, call, out, completion)
    state = call.choices.get(call.index_of[out.request_id] * call.body.n + completion.index)
    num_sent = 0 if state is None else state.num_tokens
    choice = _delta_choice(ctx, call, out, completion)
    if choice is not None:
        _log_delta(ctx, call, out.request_id, choice, completion.token_ids[num_sent:])
    return choice


async def _collect(finals: dict, gen: Generation, wait_disconnect) -> None:
    """Wait for every final output (into finals, by request id); a client that leaves first
    aborts the request at once."""
    gone = asyncio.ensure_future(wait_disconnect())
    try:
        while not gen.done:
            news = asyncio.ensure_future(gen.next())
            await asyncio.wait({news, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not news.done():
                news.cancel()
                gen.abort()
                raise APIError(400, "client disconnected")
            for kind, payload in news.result():
                if kind == "error":
                    raise _as_api_error(payload)
                _raise_if_failed(payload)
                if payload.finished:
                    finals[payload.request_id] = payload
    finally:
        gone.cancel()


def _raise_if_failed(out) -> None:
    """A sample the engine finished with finish_reason "error" (its step raised: EngineCore
    fails that step's requests and serves on) fails the HTTP request with a 500, as a request the
    engine loop drops (`failed`) does and as vLLM answers one whose finish reason is "error":
    "error" is no OpenAI finish_reason, and its partial text is no answer. The caller's finally
    aborts the request's other samples and prompts."""
    for completion in out.outputs:
        if completion.finish_reason == ERROR:
            raise _as_api_error(EngineRequestError(completion.error or "the engine failed the request"))


def _as_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ServerShuttingDown):
        return APIError(503, str(exc))
    if isinstance(exc, ValueError):
        return bad_request(exc)
    err = APIError(500, f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc  # its stack (--log-error-stack) goes on to the engine's error
    return err


# ---- beam search --------------------------------------------------------------------------------


async def _beam_search(
    ctx: ServerContext, call: _Call, max_tokens: Optional[int], logprobs: Optional[int], wait_disconnect
):
    """use_beam_search (serving_beam.py states the rules): every prompt's search at once, one
    batch of engine requests a step (_beam_step); then each prompt's best beams as its finished
    output, answered as any full body, or with stream=true as a stream of whole choices, one a
    frame (a beam's text is known only at the end), the usage chunk if asked, and [DONE]."""
    body = call.body
    _check_beam_request(call)
    name = (
        "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    )
    params = serving_beam.beam_params(body, _max_tokens(call, ctx, max_tokens), ctx.sampling_defaults, name)
    lp_name = "logprobs" if call.kind == "completion" else "top_logprobs"
    serving_beam.check_logprobs(
        params, logprobs, lp_name, ctx.engine.args.max_logprobs, ctx.engine.vocab_size
    )
    num_beams = len(call.prompts) * params.beam_width
    if num_beams > ctx.engine.capacity:
        raise _too_large(call, RequestTooLarge(num_beams, ctx.engine.capacity))
    instances = serving_beam.instances(call.prompts, params.max_tokens, ctx.max_model_len, body.cache_salt)
    eos = serving_beam.eos_token_id(ctx.tokenizer, getattr(ctx.engine.info, "eos_token_id", None))
    cached: list = []
    step = _beam_step(ctx, call, serving_beam.step_params(params, body.seed), wait_disconnect, cached)
    await run_beam_search_async(instances, step, params, eos)
    decode = serving_beam.decoder(ctx.tokenizer, body, keep_special=_parses_tool_calls(ctx, call))
    for i, (prompt, instance) in enumerate(zip(call.prompts, instances)):
        rid = f"{call.engine_id}-{i}"
        call.index_of[rid] = i
        call.finals[rid] = serving_beam.request_output(
            rid, prompt, instance, params, eos, decode, logprobs, cached[i]
        )
    if body.stream:
        return _stream(ctx, call, _Ready(list(call.finals.values())))
    return _full_body(ctx, call)


def _check_beam_request(call: _Call) -> None:
    """A 400 naming the first field a beam search cannot honour (serving_beam.REFUSED), or chat's
    tool_choice where it forces the reply (by structured outputs, which no step follows)."""
    refused = serving_beam.refused_field(call.body)
    if refused is not None:
        raise APIError(400, f"`{refused}` is not supported with use_beam_search", refused)
    if call.tool_mode in ("required", "named"):
        raise APIError(400, 'tool_choice "required" or a named function is not supported with use_beam_search (it forces the reply by structured outputs)', "tool_choice")  # fmt: skip  # noqa: E501


def _beam_step(ctx: ServerContext, call: _Call, params: SamplingParams, wait_disconnect, cached: list):
    """beam_search.AsyncStepFn over the engine: a step's beams as engine requests of one token
    each, submitted together (admitted as one batch, all or none) and awaited together; a client
    that leaves aborts them. The first step's num_cached_tokens (one beam a prompt, in prompt
    order) go to `cached`: what the prefix cache served of each prompt."""
    steps = itertools.count()

    async def step(batch):
        base = f"{call.engine_id}-step{next(steps)}"
        subs = [
            NewRequest(f"{base}-{i}", None, ids, params, call.body.priority, salt)
            for i, (ids, salt) in enumerate(batch)
        ]
        gen = await _engine_submit(ctx, call, subs)
        finals: dict = {}
        try:
            await _collect(finals, gen, wait_disconnect)
        finally:
            gen.abort()
        outs = [finals[sub.request_id] for sub in subs]
        if not cached:
            cached.extend(out.num_cached_tokens for out in outs)
        return [out.outputs[0].logprobs[0] if out.outputs[0].logprobs else None for out in outs]

    return step


class _Ready:
    """A Generation whose outputs are all in (a beam search's): next() hands them over at once."""

    def __init__(self, outputs: list) -> None:
        self._items = [("output", out) for out in outputs]

    @property
    def done(self) -> bool:
        return not self._items

    async def next(self) -> list:
        items, self._items = self._items, []
        return items

    def abort(self) -> None:
        pass


# ---- text and logprobs --------------------------------------------------------------------------


def _held_back(state: _Choice, text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of the choice's text that is a proper prefix of some stop
    string (a stream holds it back while the stop string would be cut: not with
    include_stop_str_in_output, as in the engine's detokenizer). The text only grows, so the
    choice follows it as it does (StopPrefixes): a frame costs its new characters, where
    searching it again each frame cost the stop strings' length times the text's."""
    if state.stop_prefixes is None:
        state.stop_prefixes = StopPrefixes(stops)
    return state.stop_prefixes.held(text)


def _finite(logprob: Optional[float]) -> Optional[float]:
    """JSON has no infinities and no NaN: a masked token's -inf goes out as -9999.0, as vLLM
    sends it, and so does a NaN (logits that overflowed, an fp16 model's +inf, make every raw
    logprob of their row NaN), which `max` alone would pass through: the full body then failed
    to render (a 500 after the whole generation) and stream frames carried a bare NaN that
    strict JSON parsers refuse. A plain float (the engine's values are `Logprob`s, floats with
    a rank and a decoded token)."""
    if logprob is None:
        return None
    value = float(logprob)
    return max(value, -9999.0) if math.isfinite(value) else -9999.0


def _token_text(ctx: ServerContext, token: int, logprob=None, as_id: bool = False) -> str:
    """A token's text: the decoded_token its Logprob already carries (the engine's output
    processor or the request stream named it, `decode([id])` as here), else decoded now;
    "token_id:N" when `as_id` (vLLM's return_tokens_as_token_ids)."""
    if as_id:
        return f"token_id:{token}"
    named = getattr(logprob, "decoded_token", None)
    if named is not None:
        return named
    return ctx.tokenizer.decode([token]) if ctx.tokenizer is not None else f"token_id:{token}"


def _completion_logprobs(ctx, token_ids, logprobs, offset: int, as_ids: bool = False) -> Optional[dict]:
    """The completion choice's logprobs; `as_ids`: tokens named "token_id:N" (text offsets
    advance by those names' lengths, as vLLM's do)."""
    if logprobs is None:
        return None
    tokens, token_lps, tops, offsets = [], [], [], []
    for tok, entry in zip(token_ids, logprobs):
        if entry is None:  # an echoed prompt's first token: nothing before it to score it
            tokens.append(_token_text(ctx, tok, None, as_ids))
            token_lps.append(None)
            tops.append(None)
        else:
            tokens.append(_token_text(ctx, tok, entry.get(tok), as_ids))
            token_lps.append(_finite(entry.get(tok)))
            tops.append(
                {
                    _token_text(ctx, t, lp, as_ids): _finite(lp)
                    for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])
                }
            )
        offsets.append(offset)
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(ctx, token_ids, logprobs, k: int, as_ids: bool = False) -> Optional[dict]:
    """The chat choice's logprobs: per token its own and the k best (k = -1: all the engine
    returned, the whole vocabulary, as SamplingParams.logprobs = -1 asks). `as_ids`: tokens
    named "token_id:N"; as in vLLM a sampled token's bytes stay its text's, a top entry's are
    its name's."""
    if logprobs is None:
        return None
    content, end = [], None if k == ALL_LOGPROBS else k
    for tok, entry in zip(token_ids, logprobs):
        text = _token_text(ctx, tok, entry.get(tok))
        top = [
            (_token_text(ctx, t, lp, as_ids), lp)
            for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])[:end]
        ]
        content.append(
            {
                "token": _token_text(ctx, tok, entry.get(tok), as_ids),
                "logprob": _finite(entry.get(tok)),
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": top_text, "logprob": _finite(lp), "bytes": list(top_text.encode())}
                    for top_text, lp in top
                ],
            }
        )
    return {"content": content}


def _prompt_logprobs(ctx, out) -> Optional[list]:
    """The response's prompt_logprobs as vLLM serves them: per prompt token (None for the
    first) {token id: {"logprob", "rank", "decoded_token"}}, each entry its Logprob's fields
    (-inf sent as -9999.0)."""
    if out.prompt_logprobs is None:
        return None
    return [
        None
        if entry is None
        else {
            str(t): {"logprob": _finite(lp), "rank": lp.rank, "decoded_token": _token_text(ctx, t, lp)}
            for t, lp in entry.items()
        }
        for entry in out.prompt_logprobs
    ]


def _logprobs(ctx, call: _Call, token_ids, logprobs, offset: int = 0):
    if logprobs is None:  # none asked: no server defaults to read (the choice builders' tests pass no ctx)
        return None
    as_ids = _as_token_ids(ctx, call.body)
    if call.kind == "completion":
        return _completion_logprobs(ctx, token_ids, logprobs, offset, as_ids)
    return _chat_logprobs(ctx, token_ids, logprobs, call.body.top_logprobs or 0, as_ids)


def _as_token_ids(ctx: ServerContext, body: _Sampling) -> bool:
    """Whether logprobs name tokens "token_id:N": the body's return_tokens_as_token_ids where
    set (false too), else --return-tokens-as-token-ids (vLLM's precedence)."""
    given = body.return_tokens_as_token_ids
    return ctx.return_tokens_as_token_ids if given is None else bool(given)


def _stream_usage(ctx: ServerContext, body: _Sampling) -> tuple[bool, bool]:
    """(a usage chunk before [DONE], each chunk's usage so far) of a stream: the body's
    stream_options (continuous_usage_stats counts only with include_usage, vLLM's rule); under
    --enable-force-include-usage the usage chunk always, and continuous usage where the body
    asks continuous_usage_stats (vLLM's should_include_usage)."""
    if not ctx.force_include_usage:
        return body.include_usage, body.continuous_usage
    options = body.stream_options
    return True, bool(options is not None and options.continuous_usage_stats)


def _usage(ctx, call: _Call, outputs) -> dict:
    """OpenAI's usage of a finished call; with --enable-prompt-tokens-details also
    prompt_tokens_details.cached_tokens, the prompt tokens the prefix cache served (over every
    prompt of the call), as vLLM reports it."""
    prompt = sum(len(ids) for _, ids in call.prompts)
    completion = 0 if call.echo_only else sum(len(c.token_ids) for out in outputs for c in out.outputs)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if ctx.enable_prompt_tokens_details:
        cached = sum(out.num_cached_tokens or 0 for out in outputs)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


# ---- echo ---------------------------------------------------------------------------------------
# A completion with echo=true begins each choice with its prompt: the text, and with logprobs the
# prompt's tokens (as the prompt logprobs the engine computed, k = logprobs) before the choice's
# own, the first prompt token's logprob and top entries null (nothing comes before it), text
# offsets counted from the prompt's start. With max_tokens 0 a choice is its prompt alone,
# finish_reason "length", 0 completion tokens: a prompt's scoring, as lm-evaluation-harness asks
# for its log-likelihoods. The engine still draws one token (its step computes the prompt's
# logprobs), which nobody sees. return_token_ids' token_ids stay the generated ones.
# In a stream, as vLLM's, each choice's first chunk carries its prompt (with logprobs, the
# prompt's entries before those of its first tokens); the engine hands the prompt's logprobs
# with the request's first output (engine/core_proc.py), and a choice that has news before them
# (an n > 1 sibling ahead of sample 0, which computes them) waits for them (_echo_waits). The
# chunks of a choice, concatenated, are its full body's choice, text offsets included.


def _check_echo(call: _Call) -> None:
    """A 400 for what echo cannot do here: beam search (its choices are whole beams,
    serving_beam.py; there are no prompt logprobs to lead them)."""
    if call.echo and call.body.use_beam_search:
        raise APIError(400, "`echo` is not supported with use_beam_search", "echo")


def _prompt_entries(out) -> list:
    """The output's prompt logprobs as a list a prompt token (the first None); all None where
    the output has none (an aborted request's, whose prompt never ran in full)."""
    return list(out.prompt_logprobs or [None] * len(out.prompt_token_ids))


def _echo_waits(call: _Call, out, completion, state: _Choice) -> bool:
    """Whether a streamed echo choice with logprobs must hold its first chunk: its prompt's
    logprobs have not arrived yet. They come with the request's first output ids (sample 0's)
    or at the latest with its final output, so the wait ends; a finished request's output
    without them (aborted) goes out with null entries, as the full body does."""
    return (
        call.echo
        and not state.started
        and completion.logprobs is not None
        and out.prompt_logprobs is None
        and not out.finished
    )


def _prompt_text(ctx: ServerContext, call: _Call, out) -> str:
    """The prompt as the client sent it (a text prompt's own text), or as its ids decode (token
    prompts; truncated ones); "" without a tokenizer."""
    text, ids = call.prompts[call.index_of[out.request_id]]
    if text is not None and call.body.truncate_prompt_tokens is None:
        return text
    return ctx.tokenizer.decode(list(ids)) if ctx.tokenizer is not None else ""


def _echo_choice(ctx, call: _Call, out, completion, choice: dict) -> dict:
    """_full_choice under echo (the section above)."""
    body = call.body
    prompt_ids = list(out.prompt_token_ids)
    own_ids, own_lps, text = list(completion.token_ids), completion.logprobs, completion.text
    if call.echo_only:
        own_ids, own_lps, text = [], ([] if own_lps is not None else None), ""
    logprobs = None
    if own_lps is not None:
        logprobs = _logprobs(ctx, call, prompt_ids + own_ids, _prompt_entries(out) + list(own_lps))
    choice.update(text=_prompt_text(ctx, call, out) + text, logprobs=logprobs)
    if body.prompt_logprobs is not None:
        choice["prompt_logprobs"] = _prompt_logprobs(ctx, out)
    if body.return_token_ids:
        choice["prompt_token_ids"] = prompt_ids
    if call.echo_only:
        choice.update(finish_reason="length", stop_reason=None)
    else:
        choice.update(finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)
    if body.return_token_ids:
        choice["token_ids"] = own_ids
    return choice


def _echo_delta(ctx, call: _Call, out, completion, index: int, state: _Choice) -> Optional[dict]:
    """A streamed choice under echo_only: nothing until its request ends, then one frame of its
    prompt (with logprobs, the prompt's, which it waits for: _echo_waits), finished:
    _echo_choice's choice."""
    if completion.finish_reason is None or _echo_waits(call, out, completion, state):
        return None
    state.started = state.finished = True
    logprobs = None
    if completion.logprobs is not None:
        logprobs = _logprobs(ctx, call, list(out.prompt_token_ids), _prompt_entries(out))
    choice = {"index": index, "text": _prompt_text(ctx, call, out), "logprobs": logprobs}
    if call.body.return_token_ids:
        choice["prompt_token_ids"] = list(out.prompt_token_ids)
    choice.update(finish_reason="length", stop_reason=None)
    if call.body.return_token_ids:
        choice["token_ids"] = []
    return choice


# ---- full bodies --------------------------------------------------------------------------------


def _full_choice(ctx, call: _Call, out, completion) -> dict:
    index = call.index_of[out.request_id] * call.body.n + completion.index
    choice = {"index": index}
    text = completion.text
    if call.echo:
        return _echo_choice(ctx, call, out, completion, choice)
    logprobs = _logprobs(ctx, call, completion.token_ids, completion.logprobs)
    if call.kind == "completion":
        choice.update(text=text, logprobs=logprobs)
        if call.body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(ctx, out)
        if call.body.return_token_ids:
            choice["prompt_token_ids"] = list(out.prompt_token_ids)
        choice.update(finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)
    else:
        message = _message(call, text)
        if call.chat_echo:
            message["content"] = call.chat_echo + (message["content"] or "")
        finish = call.finish_reason(completion.finish_reason, len(message.get("tool_calls", ())))
        choice.update(
            message=message, logprobs=logprobs, finish_reason=finish, stop_reason=completion.stop_reason
        )
    if call.body.return_token_ids:
        choice["token_ids"] = list(completion.token_ids)
    return choice


def _message(call: _Call, text: str) -> dict:
    """A chat choice's message. Under --reasoning-parser the reply is split (null where empty;
    `reasoning` null where the request set include_reasoning false); with tool parsing its
    content's tool calls go to `tool_calls` (the first only with parallel_tool_calls false),
    which a reply without calls leaves out, as vLLM does: the SDK reads a `[]` as "not None",
    and agent loops that test that take the answer for a call."""
    if not call.parsed:
        return {"role": call.role, "content": text}
    message: dict = {"role": call.role, "content": text or None}
    if call.reasoning is not None:
        reasoning, message["content"] = call.reasoning.split(text, call.starts_in_reasoning)
        message["reasoning"] = reasoning if call.body.include_reasoning else None
    if call.tool_parsing:
        content, calls = call.tool_stream().feed(message["content"] or "", final=True)
        message["content"] = content or None
        if calls:
            message["tool_calls"] = [
                _tool_call_json(c, call.tool_parser) for c in calls[: 1 if call.single_tool_call else None]
            ]
    return message


def _tool_call_json(call: ToolCall, parser: str) -> dict:
    """OpenAI's tool call object, with a fresh id in vLLM's form for the server's parser
    (tool_parsers.tool_call_id; forced calls too, so a Mistral template takes them back)."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": tool_call_id(parser), "type": "function", "function": function}


def _full_body(ctx, call: _Call) -> dict:
    outputs = [call.finals[rid] for rid in call.index_of]
    choices = [_full_choice(ctx, call, out, c) for out in outputs for c in out.outputs]
    body = {
        "id": call.response_id,
        "object": "text_completion" if call.kind == "completion" else "chat.completion",
        "created": call.created,
        "model": call.model,
        "choices": sorted(choices, key=lambda c: c["index"]),
        "usage": _usage(ctx, call, outputs),
    }
    if call.kind == "chat":
        if call.body.prompt_logprobs is not None:
            body["prompt_logprobs"] = _prompt_logprobs(ctx, outputs[0])
        if call.body.return_token_ids:
            body["prompt_token_ids"] = list(outputs[0].prompt_token_ids)
    return body


# ---- streaming ----------------------------------------------------------------------------------


def _chunk(call: _Call, choices: list[dict], usage: Optional[dict] = None) -> dict:
    body = {
        "id": call.response_id,
        "object": "text_completion" if call.kind == "completion" else "chat.completion.chunk",
        "created": call.created,
        "model": call.model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def _chunk_head(call: _Call) -> str:
    """The text of a chunk frame up to its choices list: `data: {"id":..,"model":..,"choices":`.
    It is the same for every chunk of a call, so it is rendered once; frame_choices(...) equals
    frame(_chunk(call, choices)) byte for byte (dicts keep their insertion order)."""
    head = frame(_chunk(call, []))
    return head[: head.rindex("[]}")]


def _frame_choices(head: str, choices: list) -> str:
    """The frame of these choices (dicts, or JSON texts of dicts): encode_json of a list is its
    items' encodings joined by commas, so pre-encoded items change nothing in the bytes."""
    items = ",".join([c if type(c) is str else encode_json(c) for c in choices])
    return f"{head}[{items}]}}\n\n"


def _frame_choice_usage(head: str, choice, usage: dict) -> str:
    """frame(_chunk(call, [choice], usage)), byte for byte, for a choice dict or its JSON text."""
    item = choice if type(choice) is str else encode_json(choice)
    return f'{head}[{item}],"usage":{encode_json(usage)}}}\n\n'


def _usage_frames(ctx, call: _Call, head: str, out) -> list[str]:
    """continuous_usage_stats: one frame per choice with news, each carrying that choice's usage
    so far (its prompt's tokens, its own tokens), as vLLM sends them (one choice a chunk)."""
    prompt = len(out.prompt_token_ids)
    frames = []
    for completion in out.outputs:
        choice = _stream_choice(ctx, call, out, completion)
        if choice is not None:
            done = 0 if call.echo_only else len(completion.token_ids)
            usage = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
            frames.extend(_frame_choice_usage(head, part, usage) for part in _finish_apart(choice))
    return frames


def _finish_apart(choice: Union[dict, str]) -> list:
    """[choice]; or, for a finishing chat choice that brings tool calls, that choice without its
    finish and then one with only the finish (an empty delta), for two frames. The openai SDK's
    stream helper closes a call (its `tool_calls.function.arguments.done` event) when a later
    chunk moves past it, or at a finish_reason, which it handles before the chunk's calls: a
    call arriving with the finish would never be closed. (vLLM sends a call's name before its
    end, so its calls never arrive with the finish.)"""
    if type(choice) is str or choice["finish_reason"] is None or "tool_calls" not in choice.get("delta", {}):
        return [choice]
    finish = {"index": choice["index"], "delta": {}, "logprobs": None}
    finish.update(finish_reason=choice["finish_reason"], stop_reason=choice["stop_reason"])
    if "token_ids" in choice:
        finish["token_ids"] = []
    return [{**choice, "finish_reason": None, "stop_reason": None}, finish]


def _plain_choice_json(kind: str, index: int, delta_text: str) -> str:
    """encode_json of the choice dict _delta_choice builds for a started, unfinished choice with
    no logprobs and no token ids (every frame of a plain stream but its first and last), written
    out directly: that is the per-token hot path, and this costs a tenth of the JSON encoder."""
    if kind == "completion":
        return f'{{"index":{index},"text":{_escape(delta_text)},"logprobs":null,"finish_reason":null,"stop_reason":null}}'
    return (
        f'{{"index":{index},"delta":{{"content":{_escape(delta_text)}}},'
        '"logprobs":null,"finish_reason":null,"stop_reason":null}'
    )


def _delta_logprobs(ctx, call: _Call, out, state: _Choice, token_ids, logprobs) -> Optional[dict]:
    """The logprobs of a choice's new tokens, led in an echo's first frame by its prompt's (the
    "echo" section); completions' text_offset continues from state.lp_offset (not from the
    text sent: held-back text has had its logprobs sent)."""
    if call.echo and not state.started:
        token_ids = list(out.prompt_token_ids) + list(token_ids)
        logprobs = _prompt_entries(out) + list(logprobs)
    lps = _logprobs(ctx, call, token_ids, logprobs, state.lp_offset)
    if call.kind == "completion" and lps is not None and lps["tokens"]:
        state.lp_offset = lps["text_offset"][-1] + len(lps["tokens"][-1])
    return lps


def _delta_choice(ctx, call: _Call, out, completion) -> Union[dict, str, None]:
    """The choice's new text and ids since its last frame (a dict, or its JSON text on the hot
    path: see _plain_choice_json), or None when there is nothing new. Any other frame's choice
    is _choice_dict's, built before the choice's state advances past what the frame carries;
    the plain hot path (_plain_choice_json) never calls it."""
    index = call.index_of[out.request_id] * call.body.n + completion.index
    state = call.choices.get(index)
    if state is None:
        state = call.choices[index] = _Choice()
    elif state.finished:
        return None
    if call.echo_only:
        return _echo_delta(ctx, call, out, completion, index, state)
    if call.echo and _echo_waits(call, out, completion, state):  # no call on the plain hot path
        return None
    finished = completion.finish_reason is not None
    if finished:
        text = completion.text
        end = len(text)
    else:
        text = completion.text
        held = call.stops and not call.body.include_stop_str_in_output  # a stop string stays: none
        end = len(text) - _held_back(state, text, call.stops) if held else len(text)
    num_chars = state.num_chars
    if end < num_chars:
        end = num_chars
    delta_text = text[num_chars:end]
    token_ids = completion.token_ids
    num_tokens = state.num_tokens
    if not delta_text and len(token_ids) <= num_tokens and not finished and state.started:
        return None
    body = call.body
    plain = completion.logprobs is None and not body.return_token_ids
    if call.parsed:
        delta = _parsed_delta(call, state, delta_text, finished)
        if not delta and plain and state.started and not finished:  # all held back: nothing new
            state.num_chars, state.num_tokens = end, len(token_ids)
            return None
    elif state.started and not finished and plain:
        state.num_chars, state.num_tokens = end, len(token_ids)
        return _plain_choice_json(call.kind, index, delta_text)
    else:
        delta = {"content": delta_text}
    choice = _choice_dict(ctx, call, out, completion, state, index, delta_text, delta)
    state.num_chars = end
    state.num_tokens = len(token_ids)
    state.started, state.finished = True, finished
    return choice


def _choice_dict(ctx, call: _Call, out, completion, state: _Choice, index: int, delta_text: str, delta):
    """The choice of a frame off the plain hot path (_plain_choice_json): a first frame (the
    chat role and echo, a completion echo's prompt text and prompt_token_ids), a finishing one
    (the finish and stop reasons), one with logprobs or token ids, or a parsed chat delta. It
    reads the choice's state as it was before this frame (started, num_tokens); _delta_choice
    advances it afterwards. Only _delta_logprobs changes it here (the logprobs' text offset)."""
    body = call.body
    finished = completion.finish_reason is not None
    token_ids = completion.token_ids
    num_tokens = state.num_tokens
    lps = None
    if completion.logprobs is not None:
        lps = _delta_logprobs(ctx, call, out, state, token_ids[num_tokens:], completion.logprobs[num_tokens:])
    choice: dict = {"index": index}
    if call.kind == "completion":
        choice["text"] = (
            delta_text if state.started or not call.echo else _prompt_text(ctx, call, out) + delta_text
        )
        choice["logprobs"] = lps
        if not state.started and body.return_token_ids:
            choice["prompt_token_ids"] = list(out.prompt_token_ids)
    else:
        if not state.started:
            delta = {"role": call.role, **(delta or {"content": ""})}
            if call.chat_echo:
                delta["content"] = call.chat_echo + delta.get("content", "")
        choice["delta"] = delta
        choice["logprobs"] = lps
    choice["finish_reason"] = completion.finish_reason
    if finished and call.kind == "chat":
        choice["finish_reason"] = call.finish_reason(completion.finish_reason, state.num_calls)
    choice["stop_reason"] = completion.stop_reason if finished else None
    if body.return_token_ids:
        choice["token_ids"] = token_ids[num_tokens:]
    return choice


def _parsed_delta(call: _Call, state: _Choice, delta_text: str, finished: bool) -> dict:
    """A chat delta through the call's parsers, as _message splits the whole reply: the new
    text's reasoning, content and tool calls, each only where there are some (text that may
    begin a tag is held back by the choice's streams until a later delta settles it)."""
    reasoning, content = "", delta_text
    if call.reasoning is not None:
        if state.reasoning is None:
            state.reasoning = ReasoningStream(call.starts_in_reasoning)
        reasoning, content = state.reasoning.feed(delta_text, final=finished)
    calls: list[ToolCall] = []
    if call.tool_parsing:
        if state.tools is None:
            state.tools = call.tool_stream()
        content, calls = state.tools.feed(content, final=finished)
        if call.single_tool_call:
            calls = calls[: max(0, 1 - state.num_calls)]
    delta: dict = {}
    if reasoning and call.body.include_reasoning:
        delta["reasoning"] = reasoning
    if content:
        delta["content"] = content
    if calls:
        delta["tool_calls"] = [
            {"index": state.num_calls + i, **_tool_call_json(c, call.tool_parser)}
            for i, c in enumerate(calls)
        ]
        state.num_calls += len(calls)
    return delta


def _output_frames(ctx, call: _Call, head: str, out, continuous: bool) -> list[str]:
    """The frames of one output's news: a frame a choice, as vLLM and OpenAI stream n > 1
    samples (clients ported from vLLM read `chunk.choices[0]`: a frame of two choices lost the
    second's text), each choice's delta followed by the finish that follows tool calls
    (_finish_apart); with continuous usage, the choice's usage too (_usage_frames)."""
    if continuous:
        return _usage_frames(ctx, call, head, out)
    frames = []
    for completion in out.outputs:
        choice = _stream_choice(ctx, call, out, completion)
        if choice is not None:
            parts = _finish_apart(choice) if call.tool_parsing else (choice,)
            frames.extend(_frame_choices(head, [part]) for part in parts)
    return frames


def _with_prompt_ids(chunk_frame: str, prompt_token_ids) -> str:
    """A chunk frame with a top-level prompt_token_ids after its other keys (frame() of the
    chunk dict with that key added last, byte for byte)."""
    assert chunk_frame.endswith("}\n\n"), chunk_frame
    return f'{chunk_frame[:-3]},"prompt_token_ids":{encode_json(list(prompt_token_ids))}}}\n\n'


async def _stream(ctx, call: _Call, gen: Generation) -> AsyncIterator[str]:
    """SSE frames: deltas, then (include_usage) a usage chunk with no choices, then [DONE]. An
    error after the stream started goes out as one error frame, then [DONE]. A frame has the
    news of one choice (_output_frames), with continuous usage its usage so far too. A
    finish that comes with tool calls follows them in a frame of its own (_finish_apart). A
    chat stream with return_token_ids has the prompt's ids in its first chunk only (top level,
    as vLLM sends them; the full body has them at the top level too): completions have them in
    each choice's first frame instead (_delta_choice)."""
    head = _chunk_head(call)
    include_usage, continuous = _stream_usage(ctx, call.body)
    prompt_ids_due = call.kind == "chat" and bool(call.body.return_token_ids)
    try:
        while not gen.done:
            items = await gen.next()
            try:
                if items[0][0] == "error":
                    raise _as_api_error(items[0][1])
                for _, out in items:
                    _raise_if_failed(out)
            except APIError as err:
                log_error_stack(ctx, err)
                yield frame(error_body(err.status, err.message, err.param))
                yield DONE
                return
            try:
                frames = []
                for _, out in items:
                    if out.finished:
                        call.finals[out.request_id] = out
                    frames += _output_frames(ctx, call, head, out, continuous)
                    if prompt_ids_due and frames:
                        frames[0] = _with_prompt_ids(frames[0], out.prompt_token_ids)
                        prompt_ids_due = False
            except Exception as exc:  # a bug in a frame builder (a parser, say): the client
                log.exception("building a stream frame failed")  # gets an error, not a cut stream
                yield frame(error_body(500, f"{type(exc).__name__}: {exc}", None))
                yield DONE
                return
            for chunk_frame in frames:
                yield chunk_frame
        _log_outputs(ctx, call, streaming=True)
        if include_usage:
            outputs = [call.finals[rid] for rid in call.index_of]
            yield frame(_chunk(call, [], _usage(ctx, call, outputs)))
        yield DONE
    finally:
        gen.abort()  # the client left (or the server is stopping): free the blocks now
