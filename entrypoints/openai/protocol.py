"""Request bodies of the OpenAI API plus vLLM's extra sampling fields.

Every model forbids unknown fields (a typo in a parameter name is a 400, not a silent default);
bounds declared here (seed in int64) are 400s naming the field too (api_server._parse). OpenAI
fields the server does not implement (suffix, functions, ...) are declared, then
refused by name unless their value is a no-op (_COMPLETION_UNSUPPORTED, _CHAT_UNSUPPORTED).
response_format (text, json_object, json_schema) and vLLM's structured_outputs become
SamplingParams.structured_outputs (sampling.py).
Null is "unset" for every OpenAI field, as OpenAI's schema marks them nullable (n included).
Responses are plain dicts built in serving.py (serving_responses.py for the Responses API):
their shape is fixed by the client, not checked. ResponsesRequest (POST /v1/responses) refuses
the OpenAI fields it does not implement the same way (_RESPONSES_UNSUPPORTED).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

# vLLM's seed bound (torch.long's range); outside it a seed would wrap modulo 2**64.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_tools(body) -> bool:
    return not getattr(body, "tools", None) and not getattr(body, "functions", None)


# OpenAI fields this server does not implement: each is taken (so that it is not "an extra
# input", which reads like a typo) and then refused by name (serving._check_request) unless its
# value asks for nothing: null, or the no-op value the test names.
_COMPLETION_UNSUPPORTED: dict[str, Callable[[Any, Any], bool]] = {
    "suffix": lambda value, body: value == "",
    "best_of": lambda value, body: value == body.n,
}
_CHAT_UNSUPPORTED: dict[str, Callable[[Any, Any], bool]] = {
    "functions": lambda value, body: value == [],
    "function_call": lambda value, body: value == "none" or (value == "auto" and _no_tools(body)),
    "store": lambda value, body: value is False,
    # OpenAI's newer chat fields: each value that asks for what OpenAI does by default is a no-op
    "audio": lambda value, body: False,
    "modalities": lambda value, body: value == ["text"],
    "prediction": lambda value, body: False,
    "service_tier": lambda value, body: value in ("auto", "default"),
    "verbosity": lambda value, body: value == "medium",
    "web_search_options": lambda value, body: False,
    "prompt_cache_retention": lambda value, body: value == "in_memory",
    "moderation": lambda value, body: False,
    "prompt_cache_options": lambda value, body: False,
}


# vLLM's structured-output fields before 0.12, which removed them (its server now ignores them
# as unknown fields, so a request that sends one gets unconstrained output): here an unknown
# field is a 400 as any other, whose message names the structured_outputs key that replaced it.
LEGACY_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_whitespace_pattern": "whitespace_pattern",
}
# vLLM's successors that this server's StructuredOutputsParams lacks: their hint says so (and
# what there is instead) rather than name a key that is a 400 of its own (an unknown field)
_LEGACY_UNSUPPORTED = {
    "whitespace_pattern": "give `disable_any_whitespace` to allow no whitespace beyond the JSON's own",
}


def legacy_field_hint(name: str) -> Optional[str]:
    """What to send instead of one of vLLM's removed guided decoding fields (None for others).
    Invariant: a `"structured_outputs": {key: ...}` it names is a key this server takes."""
    key = LEGACY_GUIDED.get(name)
    if key in _LEGACY_UNSUPPORTED:
        return (
            f"`{name}` was removed in vLLM 0.12, and its successor `structured_outputs.{key}` is "
            f"not supported by this server; {_LEGACY_UNSUPPORTED[key]}"
        )
    if key is not None:
        return f'`{name}` was removed in vLLM 0.12; send `"structured_outputs": {{"{key}": ...}}` instead'
    if name in ("guided_decoding_backend", "guided_options_request"):
        return f"`{name}` was removed in vLLM 0.12; the constraint goes in `structured_outputs`"
    return None


class StreamOptions(_Strict):
    """`{}` is valid and means the defaults (no usage chunk). continuous_usage_stats, with
    include_usage, puts the usage so far in every chunk that has a choice."""

    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class JsonSchemaFormat(_Strict):
    """response_format's json_schema (OpenAI's shape): the output is JSON that validates
    against `schema` (`name`, `description` and `strict` are taken; the schema is always
    enforced, strict or not, as in vLLM)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    description: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Strict):
    """OpenAI's response_format: text (no constraint), json_object (any JSON object) or
    json_schema (that schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class _Sampling(_Strict):
    """Fields shared by completions and chat: OpenAI's, then vLLM's extras (sent in extra_body)."""

    model: Optional[str] = None
    n: int = 1
    max_tokens: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    seed: Optional[int] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # vLLM's extras
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    priority: int = 0
    cache_salt: Optional[str] = None
    prompt_logprobs: Optional[int] = None
    return_token_ids: Optional[bool] = False
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    # keep the prompt's last k tokens; -1: what max_tokens leaves of the context (serving._truncate)
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1, le=SEED_MAX)
    # logprob tokens as "token_id:N" (text that is not valid UTF-8 stays identifiable)
    return_tokens_as_token_ids: Optional[bool] = None
    # OpenAI's output format and vLLM's structured outputs (StructuredOutputsParams' fields)
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict[str, Any]] = None
    # vLLM's name of SamplingParams.extra_args over HTTP: passed through, read by nothing here
    vllm_xargs: Optional[dict[str, Union[str, int, float, list[Union[str, int, float]]]]] = None
    # the response's id ("cmpl-" / "chatcmpl-" + it); the X-Request-Id header wins (vLLM's rule)
    request_id: Optional[str] = None
    # vLLM's beam search: n is the beam width, the best n beams the choices (serving_beam.py)
    use_beam_search: bool = False
    length_penalty: float = 1.0  # the score's exponent; other than 1 only with use_beam_search

    _UNSUPPORTED: ClassVar[dict] = {}

    @field_validator("n", mode="before")
    @classmethod
    def _null_n_is_unset(cls, value):
        """OpenAI's schema marks n nullable (as every OpenAI field here): null means the default."""
        return 1 if value is None else value

    def unsupported_field(self) -> Optional[str]:
        """The first OpenAI field set to something this server does not do (None: none is)."""
        for name, no_op in self._UNSUPPORTED.items():
            value = getattr(self, name)
            if value is not None and not no_op(value, self):
                return name
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options is not None and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk: continuous_usage_stats counts only with include_usage (vLLM's rule)."""
        options = self.stream_options
        return bool(options is not None and options.include_usage and options.continuous_usage_stats)


class CompletionRequest(_Sampling):
    """POST /v1/completions. `prompt`: a string, a list of token ids, or a batch of either."""

    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = None
    add_special_tokens: bool = True  # a text prompt's BOS etc. (vLLM's default for completions)
    # the prompt before each choice's text (and its tokens' logprobs first); with max_tokens 0,
    # the prompt alone (a prompt's scoring: serving.py, "echo")
    echo: Optional[bool] = False
    # not supported: refused unless a no-op (_COMPLETION_UNSUPPORTED)
    suffix: Any = None
    best_of: Any = None

    _UNSUPPORTED: ClassVar[dict] = _COMPLETION_UNSUPPORTED


class _ChatTemplateFields(_Strict):
    """vLLM's extra fields for rendering `messages` (chat_utils.render_chat states their rules;
    a request's chat_template needs --trust-request-chat-template)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def template_kwargs(self) -> Optional[dict[str, Any]]:
        """The template's extra variables: chat_template_kwargs, over those a chat request's
        reasoning_effort sets (ChatCompletionRequest's docstring)."""
        effort = getattr(self, "reasoning_effort", None)
        if effort is None:
            return self.chat_template_kwargs
        if not isinstance(self.chat_template_kwargs, (dict, type(None))):
            return self.chat_template_kwargs  # chat_utils refuses it, naming the field
        return {
            "reasoning_effort": effort,
            "enable_thinking": effort != "none",
            **(self.chat_template_kwargs or {}),
        }


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ChatCompletionRequest(_Sampling, _ChatTemplateFields):
    """POST /v1/chat/completions. `max_completion_tokens` is the newer name of max_tokens.
    `reasoning_effort` (OpenAI's, with vLLM's values) reaches the chat template as its
    `reasoning_effort` variable, and as `enable_thinking` (false for "none", else true: Qwen3's
    switch, which --reasoning-parser qwen3 reads too); chat_template_kwargs that set either win."""

    max_completion_tokens: Optional[int] = None
    reasoning_effort: Optional[ReasoningEffort] = None
    # off by default: the chat template writes the special tokens itself (vLLM's default)
    add_special_tokens: bool = False
    # vLLM's: with --reasoning-parser, false leaves the reasoning out (the content stays as split)
    include_reasoning: bool = True
    # vLLM's: a final assistant message's text leads each choice's content (serving._chat_echo)
    echo: Optional[bool] = False
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    # function tools: checked by serving._tool_options (vLLM's rules)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # OpenAI's that change nothing here: safety_identifier is `user`'s successor, prompt_cache_key
    # a cache routing hint (the prefix cache needs none), metadata tags a stored completion (and
    # store is refused)
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    # not supported: refused unless a no-op (_CHAT_UNSUPPORTED)
    functions: Any = None
    function_call: Any = None
    store: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    service_tier: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    prompt_cache_retention: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None

    _UNSUPPORTED: ClassVar[dict] = _CHAT_UNSUPPORTED


class TokenizeRequest(_ChatTemplateFields):
    """POST /tokenize: either `prompt` or chat `messages` (rendered as chat renders them)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    # vLLM's defaults: True for a prompt, False for messages (the template adds them); a
    # value given applies to either
    add_special_tokens: bool = True
    return_token_strs: bool = False  # vLLM's: token_strs in the reply
    # with messages: the function tools the template shows (as a chat request's), vLLM's field
    tools: Optional[list[dict[str, Any]]] = None


class DetokenizeRequest(_Strict):
    model: Optional[str] = None
    tokens: list[int]


# ---- the Responses API (POST /v1/responses; serving_responses.py) -------------------------------


def _plain_text_format(value) -> bool:
    """text: {"format": {"type": "text"}} (or no format) asks for what the server does anyway."""
    return (
        isinstance(value, dict)
        and set(value) <= {"format", "verbosity"}
        and (value.get("format") in (None, {"type": "text"}) and value.get("verbosity") in (None, "medium"))
    )


OUTPUT_LOGPROBS = "message.output_text.logprobs"


# OpenAI's Responses fields this server does not implement: refused by name (a 400) unless the
# value asks for nothing (null, or the no-op the test names), as _CHAT_UNSUPPORTED's are.
_RESPONSES_UNSUPPORTED: dict[str, Callable[[Any, Any], bool]] = {
    "max_tool_calls": lambda value, body: False,
    "previous_response_id": lambda value, body: False,  # nothing is stored (serving_responses.py)
    "conversation": lambda value, body: False,
    "prompt": lambda value, body: False,
    "reasoning": lambda value, body: False,
    "background": lambda value, body: value is False,
    # the one includable served: the output text's logprobs (serving_responses.py)
    "include": lambda value, body: isinstance(value, list) and set(value) <= {OUTPUT_LOGPROBS},
    "truncation": lambda value, body: value == "disabled",
    "service_tier": lambda value, body: value in ("auto", "default"),
    "stream_options": lambda value, body: value == {},
    "context_management": lambda value, body: False,
    "prompt_cache_retention": lambda value, body: value == "in_memory",
    "prompt_cache_options": lambda value, body: False,
    "moderation": lambda value, body: False,
    "background_options": lambda value, body: False,
    "access_programs": lambda value, body: False,
    "image": lambda value, body: False,
}


class ResponsesRequest(_Strict):
    """POST /v1/responses: OpenAI's Responses API, its text generation (serving_responses.py).

    `input` is a string (one user message) or a list of message items ({"role", "content"},
    optionally "type": "message"; content a string or a list of input_text / output_text
    parts), function_call and function_call_output items (an earlier turn's call and its
    result); `instructions` becomes a system message before them. `tools` (function tools,
    {"type": "function", "name", "parameters", ...}), `tool_choice` and `parallel_tool_calls`
    are chat's, in Responses' form (serving_responses.py maps them). `include` of
    "message.output_text.logprobs", with `top_logprobs`, is chat's logprobs and top_logprobs. `text.format` of type
    json_schema / json_object is structured output, as chat's response_format. vLLM's extras
    (top_k, min_p, repetition_penalty, seed, stop, ...) are taken as chat takes them. `store`
    is taken and nothing is stored (vLLM's default): the response says `store: false`."""

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: Optional[bool] = False
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    store: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    # vLLM's extras (sent in extra_body), with chat's meaning
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: Optional[Union[str, list[str]]] = None
    ignore_eos: bool = False
    priority: int = 0
    cache_salt: Optional[str] = None
    request_id: Optional[str] = None
    # each output token's top_logprobs most likely tokens, with include [OUTPUT_LOGPROBS]
    top_logprobs: Optional[int] = None
    # function tools in Responses' flat form, checked and mapped onto chat's by serving_responses
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # not supported: refused unless a no-op (_RESPONSES_UNSUPPORTED)
    max_tool_calls: Any = None
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    reasoning: Any = None
    background: Any = None
    include: Any = None
    truncation: Any = None
    service_tier: Any = None
    stream_options: Any = None
    context_management: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    moderation: Any = None
    background_options: Any = None
    access_programs: Any = None
    image: Any = None

    def unsupported_field(self) -> Optional[str]:
        """The first field set to something this server does not do (None: none is); `text`
        is one unless plain text or a format that maps onto response_format (text_format)."""
        for name, no_op in _RESPONSES_UNSUPPORTED.items():
            value = getattr(self, name)
            if value is not None and not no_op(value, self):
                return name
        if self.text is not None and not _plain_text_format(self.text) and self.text_format() is None:
            return "text"
        return None

    @property
    def include_logprobs(self) -> bool:
        """Whether the output text's logprobs were asked for (include names OUTPUT_LOGPROBS)."""
        return isinstance(self.include, list) and OUTPUT_LOGPROBS in self.include

    def text_format(self) -> Optional[ResponseFormat]:
        """text.format as chat's response_format (None: plain text, or not a format that maps):
        {"type": "json_schema", "name", "schema", "strict"?, "description"?} or json_object."""
        text = self.text or {}
        fmt = text.get("format")
        if not isinstance(fmt, dict) or set(text) - {"format", "verbosity"}:
            return None
        if text.get("verbosity") not in (None, "medium"):
            return None
        if fmt.get("type") == "json_object" and set(fmt) == {"type"}:
            return ResponseFormat(type="json_object")
        if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            return None
        try:
            schema = JsonSchemaFormat.model_validate({k: v for k, v in fmt.items() if k != "type"})
        except ValueError:
            return None
        return ResponseFormat(type="json_schema", json_schema=schema)
