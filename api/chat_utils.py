"""Chat prompts: a conversation of OpenAI-style messages rendered with a Jinja chat template.

One implementation for LLM.chat and for the server's /v1/chat/completions and /tokenize, so a
conversation becomes the same prompt on both (vLLM keeps the same rules in its chat_utils).
Light on purpose: the offline API imports it, and it imports nothing of the server's.

Errors are ChatTemplateError, a ValueError carrying `param`, the request field it is about:
LLM.chat raises it as it is, the server answers 400 naming that field.

The rules (vLLM's, for templates that take string content):
- every message is a dict with a non-empty str role; which roles mean anything (system,
  developer, user, assistant, tool, or the template's own) is the template's business.
- content: a str; None is ""; a list of content parts is flattened to one string: plain str
  parts and {"type": "text", "text": ...} parts (a part without "type" counts as text where it
  has a "text" key; one whose text is None or "" is skipped, as vLLM skips it), joined with
  "\\n" as vLLM joins them; as in vLLM, OpenAI's assistant {"type": "refusal", "refusal": ...}
  parts, the Responses API's {"type": "input_text" | "output_text", "text": ...} parts and
  vLLM's {"type": "thinking", "thinking": ...} parts are text parts too. Any other part
  (image_url, input_audio, ...) is an error: the engine serves text-only models, and dropping
  the part would answer a different question than the one asked.
- chat_template_content_format (vLLM's name): "string" gives the template each message's
  content as that one string; "openai" as a list of {"type": "text", "text": ...} parts (a str
  content is one part, None none); "auto", the default, picks "openai" for a template that
  loops over a message's content (directly, or through a variable set from it), else "string",
  as vLLM detects it (flattened, the content would be looped over character by character and
  every message would render empty, without an error).
- chat_template: a Jinja template string that replaces the tokenizer's (None: the tokenizer's;
  neither: an error that begins with vLLM's own sentence, NO_CHAT_TEMPLATE, as clients that
  send a base model's requests to completions instead recognise it by that sentence).
- add_generation_prompt and continue_final_message cannot both be true (vLLM's check), and
  continue_final_message needs a last message of role "assistant": the prompt then ends inside
  that message (transformers cuts the rendering after its text), so generation continues it.
- tools: OpenAI's function tools, [{"type": "function", "function": {"name": ..., ...}}], go
  to the template (which lists them for the model, as Qwen's do); an assistant message's
  tool_calls carry their function.arguments as a JSON string (OpenAI's form), which is parsed to
  an object for the template, as vLLM does (templates write it out with `tojson`). tool_calls
  is a list (anything else is an error); a null or empty one is dropped (vLLM's rule: a
  template that tests `'tool_calls' in message` would drop the message's content).
- an assistant message's `reasoning` (the field the server answers with) also goes to the
  template as `reasoning_content`, the name Qwen3's template reads, as vLLM passes it on: an
  agent loop that sends the replies back keeps their thinking in the prompt.
- chat_template_kwargs: extra variables for the template (e.g. {"enable_thinking": False} for
  Qwen3). The names the chat call sets itself (RESERVED_KWARGS) are refused; add_generation_prompt
  and continue_final_message given there lose to the arguments of those names (vLLM merges the
  request's own fields over chat_template_kwargs).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

# set by the chat call itself: vLLM refuses chat_template and tokenize ("unexpected chat template
# kwargs"), and fails on the others, which it passes explicitly (a duplicate keyword)
RESERVED_KWARGS = ("chat_template", "tokenize", "conversation", "messages", "tools", "documents")
# the arguments of these names win over chat_template_kwargs' entries
_OVERRIDDEN_KWARGS = ("add_generation_prompt", "continue_final_message")
TEXT_PART_SEPARATOR = "\n"  # vLLM's, between the text parts of one message
# the content parts that are text (vLLM's): part type -> the key of its text
TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


# vLLM's error for a tokenizer without a chat template, word for word (vllm/renderers/hf.py)
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
    "chat template if the tokenizer does not define one."
)

# vLLM's chat_template_content_format values: how a message's content reaches the template
CONTENT_FORMATS = ("auto", "string", "openai")


class ChatTemplateError(ValueError):
    """A conversation or a chat option that cannot be rendered; `param` names the field."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


def no_chat_template_error(remedy: str) -> ChatTemplateError:
    """The error for a tokenizer without a chat template and none given: vLLM's sentence
    (NO_CHAT_TEMPLATE) first, then `remedy`, how this caller gives one; param chat_template."""
    return ChatTemplateError(
        f"{NO_CHAT_TEMPLATE} This model's tokenizer has no chat template: {remedy}", "chat_template"
    )


def message_text(content) -> str:
    """A message's content as one string (the module docstring's rules); ChatTemplateError
    (param "messages") for a non-text part or a content that is neither a str nor a list."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, (list, tuple)):
        raise ChatTemplateError(
            f"message content must be a string or a list of parts, got {type(content).__name__}"
        )
    texts = []
    for part in content:
        if isinstance(part, str):
            if part:
                texts.append(part)
            continue
        text = _part_text(part)
        if text:  # vLLM keeps only parts with some text: an empty one adds no blank line
            texts.append(text)
    return TEXT_PART_SEPARATOR.join(texts)


def message_parts(content) -> list[dict]:
    """A message's content as OpenAI-format text parts, for a template that loops over them: a
    str is one {"type": "text", "text": ...} part, None is none, and a list keeps one such part
    per text part with some text (message_text's rules and errors for the parts)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    message_text(content)  # a part that is no text, or a content that is no list: its error
    texts = [part if isinstance(part, str) else _part_text(part) for part in content]
    return [{"type": "text", "text": text} for text in texts if text]


def _part_text(part) -> Optional[str]:
    """A dict content part's text: under TEXT_PARTS' key for its type (None: a null one, which
    is skipped); ChatTemplateError for any other part, or a text that is not a str. A part
    without "type" is text only where it has a "text" key (vLLM reads a typeless
    {"image_url": ...} as an image: skipping it as text-less text would drop the image)."""
    if isinstance(part, dict) and "type" not in part and "text" not in part:
        raise ChatTemplateError(
            f"a content part without a 'type' must be a text part {{'text': ...}}, got keys {sorted(part)}; "
            "only text content parts are supported"
        )
    kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
    key = TEXT_PARTS.get(kind) if isinstance(part, dict) and isinstance(kind, str) else None
    if key is None:
        raise ChatTemplateError(f"only text content parts are supported, got a {kind!r} part")
    text = part.get(key)
    if text is not None and not isinstance(text, str):
        raise ChatTemplateError(f"a {kind} part's {key} must be a string, got {type(text).__name__}")
    return text


def chat_messages(messages, content_format: str = "string") -> list[dict]:
    """The messages with their content flattened to strings (message_text), or for
    content_format "openai" as lists of text parts (message_parts); each message must be a
    dict."""
    content_of = message_parts if content_format == "openai" else message_text
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be a dict with role and content, got {message!r}")
        _check_role(message, f"messages[{i}].role")
        clean = {**message, "content": content_of(message.get("content"))}
        calls = _tool_calls(message, f"messages[{i}].tool_calls")
        if calls:
            clean["tool_calls"] = [_template_tool_call(call, f"messages[{i}].tool_calls[{j}]")
                                   for j, call in enumerate(calls)]  # fmt: skip
        elif "tool_calls" in message:  # null or []: no calls (templates test `'tool_calls' in m`)
            del clean["tool_calls"]
        if message.get("role") == "assistant" and isinstance(message.get("reasoning"), str):
            clean["reasoning_content"] = message["reasoning"]
        out.append(clean)
    return out


def _check_role(message: dict, where: str) -> None:
    """A message's role is a non-empty str (any: the template decides what it makes of "developer"
    or a role of its own, as vLLM leaves it); ChatTemplateError naming `where` otherwise (a
    template matching on the role would drop the message without a word)."""
    role = message.get("role")
    if not (isinstance(role, str) and role):
        shown = repr(role) if "role" in message else "none"
        raise ChatTemplateError(
            f"{where} must be a non-empty string (user, assistant, system, ...), got {shown}"
        )


def _tool_calls(message: dict, where: str) -> list:
    """A message's tool_calls: a list (OpenAI's type), [] where absent or null; ChatTemplateError
    naming `where` for anything else (a str or an object would be iterated as if it were calls)."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, (list, tuple)):
        raise ChatTemplateError(f"{where} must be a list of tool calls (or null), got {calls!r}")
    return list(calls)


def _template_tool_call(call, where: str) -> dict:
    """An assistant message's tool call with its function.arguments as an object (a JSON string
    in OpenAI's form is parsed; an object is kept)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatTemplateError(
            f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}"
        )
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # no JSON, or nested deeper than json recurses
            raise ChatTemplateError(
                f"{where}.function.arguments must be a JSON object, got {arguments!r}"
            ) from None
    if not isinstance(arguments, dict):
        raise ChatTemplateError(f"{where}.function.arguments must be a JSON object, got {arguments!r}")
    return {**call, "function": {**function, "arguments": arguments}}


def check_tools(tools) -> Optional[list]:
    """tools as the template takes them: None, or a list of {"type": "function", "function":
    {"name": str, ...}} (OpenAI's function tools) whose `parameters`, where given and not null,
    are a JSON schema object (a dict, as vLLM's FunctionDefinition types them: a forced
    tool_choice compiles them); ChatTemplateError (param "tools") otherwise."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatTemplateError(
            f"tools must be a list of function tools, got {type(tools).__name__}", "tools"
        )
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not (isinstance(name, str) and name) or tool.get("type", "function") != "function":
            raise ChatTemplateError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}, "
                f"got {tool!r}",
                "tools",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ChatTemplateError(
                f"tools[{i}].function.parameters must be a JSON schema object, got {parameters!r}", "tools"
            )
    return tools


def resolve_chat_template(
    tokenizer, chat_template: Optional[str] = None, tools: Optional[list] = None
) -> Optional[str]:
    """The template source that renders: chat_template when given (it must be a non-empty str),
    else the tokenizer's (None if it has none). A tokenizer with several named templates (a dict
    of name -> template, as transformers loads them) gives the one transformers picks
    (get_chat_template: the name chat_template gives, else "tool_use" with tools, else
    "default"), so the content format is detected on that source; ChatTemplateError (param
    chat_template) where there is none to pick."""
    if chat_template is not None and (not isinstance(chat_template, str) or not chat_template.strip()):
        raise ChatTemplateError(
            f"chat_template must be a non-empty Jinja template string, got {chat_template!r}", "chat_template"
        )
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        try:
            return tokenizer.get_chat_template(chat_template, tools)
        except ValueError as exc:  # several names, none "default", and none chosen
            raise ChatTemplateError(f"chat_template: {exc}", "chat_template") from None
    return chat_template if chat_template is not None else (own or None)


def content_format_of(template: str, content_format: str = "auto") -> str:
    """The content form the template gets, "string" or "openai": content_format itself unless
    "auto", which detects it (detect_content_format); ChatTemplateError (param
    chat_template_content_format) for a value outside CONTENT_FORMATS."""
    if content_format not in CONTENT_FORMATS:
        allowed = ", ".join(repr(f) for f in CONTENT_FORMATS)
        raise ChatTemplateError(
            f"chat_template_content_format must be one of {allowed}, got {content_format!r}",
            "chat_template_content_format",
        )
    return detect_content_format(template) if content_format == "auto" else content_format


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> str:
    """The content form a template reads: "openai" where it has a `for` loop over a message's
    content (`m['content']`, `m.content`, or a name set from one, as in `{% set parts =
    m['content'] %}`; through a filter, a test or a slice too, as in `m['content'] |
    selectattr('type', 'equalto', 'text')`), else "string"; "string" too for a template that does not parse
    (rendering reports its error).
    Cached per template string: a server renders with the same one for every request."""
    try:
        from jinja2 import Environment, nodes
    except ImportError:  # rendering will say that jinja2 is missing
        return "string"
    try:
        ast = Environment(extensions=["jinja2.ext.loopcontrols", _generation_tag()]).parse(template)
    except Exception:  # a syntax error: rendering names it
        return "string"

    def is_content(node, names: set) -> bool:
        if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
            return is_content(node.node, names)  # `content | selectattr(...)`, as vLLM looks through
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            return is_content(node.node, names)  # `content[:n]`
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        if isinstance(node, nodes.Getattr):
            return node.attr == "content"
        return isinstance(node, nodes.Name) and node.name in names

    names: set = set()
    assigns = [a for a in ast.find_all(nodes.Assign) if isinstance(a.target, nodes.Name)]
    grew = True
    while grew:  # names set from content, or from such a name, to a fixed point
        found = {a.target.name for a in assigns if is_content(a.node, names)}
        grew, names = not found <= names, names | found
    loops = ast.find_all(nodes.For)
    return "openai" if any(is_content(loop.iter, names) for loop in loops) else "string"


def _generation_tag():
    """A Jinja extension that parses transformers' `{% generation %}...{% endgeneration %}`
    block (assistant-mask tracking) as its body, so detect_content_format reads such templates."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return GenerationTag


def check_chat_options(messages: list, add_generation_prompt: bool, continue_final_message: bool) -> None:
    """vLLM's rules for the two prompt-end options (see the module docstring); both are bools
    (a str continue_final_message means a field name to some transformers versions only)."""
    for name, value in (
        ("add_generation_prompt", add_generation_prompt),
        ("continue_final_message", continue_final_message),
    ):
        if not isinstance(value, bool):
            raise ChatTemplateError(f"{name} must be a bool, got {value!r}", name)
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    if continue_final_message and (not messages or messages[-1].get("role") != "assistant"):
        role = messages[-1].get("role") if messages else None
        raise ChatTemplateError(
            f"continue_final_message needs the last message to be the assistant's, got role {role!r}",
            "continue_final_message",
        )


def template_kwargs(chat_template_kwargs: Optional[dict]) -> dict[str, Any]:
    """chat_template_kwargs as they go to the template: a dict with str keys; RESERVED_KWARGS
    refused, the overridden names dropped (the module docstring says why)."""
    if chat_template_kwargs is None:
        return {}
    if not isinstance(chat_template_kwargs, dict) or not all(
        isinstance(k, str) for k in chat_template_kwargs
    ):
        raise ChatTemplateError(
            f"chat_template_kwargs must be a dict with str keys, got {chat_template_kwargs!r}",
            "chat_template_kwargs",
        )
    reserved = sorted(k for k in chat_template_kwargs if k in RESERVED_KWARGS)
    if reserved:
        raise ChatTemplateError(
            f"Found unexpected chat template kwargs from request: {reserved} (set by the chat call itself, "
            f"or not supported: {', '.join(RESERVED_KWARGS)})",
            "chat_template_kwargs",
        )
    return {k: v for k, v in chat_template_kwargs.items() if k not in _OVERRIDDEN_KWARGS}


def render_chat(
    tokenizer,
    messages: list,
    *,
    chat_template: Optional[str] = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Optional[dict] = None,
    tools: Optional[list] = None,
    chat_template_content_format: str = "auto",
) -> str:
    """One conversation as prompt text, by the module docstring's rules. Only arguments that
    every supported transformers version's apply_chat_template has are passed (conversation,
    tokenize, add_generation_prompt, continue_final_message, chat_template, tools when given; the
    template's variables go through its **kwargs). A failure of the template itself (a Jinja error, a
    final message the template drops) is a ChatTemplateError too."""
    if tokenizer is None:  # a template alone cannot help: the rendered prompt must be tokenized
        raise ChatTemplateError(
            "chat needs the model's tokenizer to tokenize the rendered prompt; this engine has none "
            "(skip_tokenizer_init): build it with a tokenizer, or render and tokenize the prompt "
            "yourself and pass {'prompt_token_ids': [...]} to generate()",
            "tokenizer",
        )
    template = resolve_chat_template(tokenizer, chat_template, tools)
    if template is None:
        raise no_chat_template_error("pass chat_template (a Jinja template string)")
    clean = chat_messages(messages, content_format_of(template, chat_template_content_format))
    check_chat_options(clean, add_generation_prompt, continue_final_message)
    extra = template_kwargs(chat_template_kwargs)
    if check_tools(tools) is not None:
        extra["tools"] = tools
    try:
        return tokenizer.apply_chat_template(
            clean,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template=template,
            **extra,
        )
    except Exception as exc:  # a template error names the template's problem
        raise _template_failure(exc) from exc


def _template_failure(exc: Exception) -> ChatTemplateError:
    """A Jinja syntax error is the template's fault (param chat_template); any other failure is
    the template's answer to these messages (param messages)."""
    try:
        from jinja2 import TemplateSyntaxError
    except ImportError:  # transformers then failed for want of jinja2: the message says so
        TemplateSyntaxError = ()
    if isinstance(exc, TemplateSyntaxError):
        return ChatTemplateError(f"chat_template is not a valid Jinja template: {exc}", "chat_template")
    return ChatTemplateError(f"the chat template failed on these messages: {exc}")
