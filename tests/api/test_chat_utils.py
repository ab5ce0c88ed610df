"""chat_utils.render_chat, the one renderer of LLM.chat and the server: content parts, vLLM's
chat_template / add_generation_prompt / continue_final_message / chat_template_kwargs, and
their errors; then LLM.chat over it (one tiny engine for the module)."""

from __future__ import annotations

import pytest

from enginespec.chat_utils import ChatTemplateError, message_text, render_chat
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.loader import load_tokenizer

# the role's initial, its content, ";" after each message; "A:" as the generation prompt
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)
CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Yo"}]


@pytest.fixture(scope="module")
def tokenizer():
    tok = load_tokenizer(tiny_model_dir("qwen3"))
    assert not getattr(tok, "chat_template", None), "the tests give their template themselves"
    return tok


def _raises(param: str, match: str, fn, *args, **kwargs) -> ChatTemplateError:
    with pytest.raises(ChatTemplateError, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError) and info.value.param == param
    return info.value


# ---- content parts ------------------------------------------------------------------------------


def test_text_parts_are_joined_with_a_newline_as_vllm_joins_them():
    parts = [{"type": "text", "text": "a"}, "b", {"text": "c"}, {"type": "text", "text": None}]
    assert message_text(parts) == "a\nb\nc"
    assert message_text("x") == "x" and message_text(None) == "" and message_text([]) == ""


def test_a_non_text_part_or_content_is_refused_naming_it():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    _raises("messages", "'image_url' part", message_text, [{"type": "text", "text": "a"}, image])
    _raises("messages", "'int' part", message_text, [3])
    _raises("messages", "text must be a string", message_text, [{"type": "text", "text": 3}])
    _raises("messages", "string or a list of parts, got dict", message_text, {"text": "a"})


def test_a_part_without_type_is_text_only_where_it_has_a_text(tokenizer):
    """A part without "type" is a text part when it carries "text"; vLLM also takes
    {"image_url": ...} (and the other media keys) without a type, as media: such a part was
    skipped as a text-less text part, so the model answered without the image, silently."""
    for part in ({"image_url": {"url": "data:image/png;base64,AAAA"}}, {"input_audio": {"data": "AA"}}, {}):
        conversation = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
        _raises("messages", "without a 'type'", render_chat, tokenizer, conversation, chat_template=TEMPLATE)
    assert message_text([{"text": "a"}, {"text": None}]) == "a"


def test_empty_text_parts_are_skipped_as_vllm_skips_them():
    """vLLM keeps only the parts with some text before joining: an empty text part (UIs send
    them) adds no blank line; a whole content of "" is still ""."""
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, "", {"type": "text", "text": "b"}]
    assert message_text(parts) == "a\nb"
    assert message_text([{"type": "text", "text": ""}]) == "" and message_text("") == ""


def test_output_text_and_thinking_parts_are_text_as_in_vllm():
    """vLLM's text part types also include the Responses API's output_text (an assistant
    output sent back) and its thinking part ({"type": "thinking", "thinking": ...})."""
    parts = [{"type": "thinking", "thinking": "hm"}, {"type": "output_text", "text": "a"}]
    assert message_text(parts) == "hm\na"


def test_parts_render_as_their_joined_string(tokenizer):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    plain = [{"role": "user", "content": "a\nb"}]
    assert render_chat(tokenizer, parts, chat_template=TEMPLATE) == "u:a\nb;A:"
    assert render_chat(tokenizer, parts, chat_template=TEMPLATE) == render_chat(
        tokenizer, plain, chat_template=TEMPLATE
    )
    _raises("messages", "must be a dict", render_chat, tokenizer, ["hi"], chat_template=TEMPLATE)


def test_a_message_without_a_string_role_is_refused_naming_it(tokenizer):
    """OpenAI's messages all carry a role (a str); one without it (or a null or non-str one) went
    to the template, where a real template matching on the role (Qwen's) dropped the message
    silently: the model answered a conversation with a turn missing. vLLM refuses it."""
    for message in ({"content": "hi"}, {"role": None, "content": "hi"}, {"role": 3, "content": "hi"},
                    {"role": "", "content": "hi"}):  # fmt: skip
        conversation = [CONVERSATION[0], message]
        _raises(
            "messages",
            r"messages\[1\].role must be",
            render_chat,
            tokenizer,
            conversation,
            chat_template=TEMPLATE,
        )
    # any role the template knows is the template's business (vLLM passes it on), developer too
    developer = [{"role": "developer", "content": "be brief"}, CONVERSATION[0]]
    assert render_chat(tokenizer, developer, chat_template=TEMPLATE) == "d:be brief;u:hi;A:"


# ---- chat_template_content_format --------------------------------------------------------------

# a template written for OpenAI-format content: it loops over each message's parts (as templates of
# multi-modal checkpoints do), here through a variable set from the content
PARTS_TEMPLATE = (
    "{% for m in messages %}{% set parts = m['content'] %}{{ m['role'][0] }}:"
    "{% for p in parts %}{% if p['type'] == 'text' %}{{ p['text'] }}|{% endif %}{% endfor %};{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def test_a_template_that_loops_over_content_parts_gets_them_as_vllm_detects(tokenizer):
    # The content was always flattened to one string, so such a template looped over its
    # characters and rendered every message empty ("u:;a:;A:"), without an error.
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, "yo"]}, CONVERSATION[1]]
    assert render_chat(tokenizer, parts, chat_template=PARTS_TEMPLATE) == "u:hi|yo|;a:Yo|;A:"
    cont = render_chat(
        tokenizer,
        parts,
        chat_template=PARTS_TEMPLATE,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert cont == "u:hi|yo|;a:Yo"
    # a template that reads the content as a string keeps getting one ("auto" tells them apart)
    assert render_chat(tokenizer, parts, chat_template=TEMPLATE) == "u:hi\nyo;a:Yo;A:"


# LLaVA-style templates (llava-1.5-hf, llava-onevision, aya-vision) filter the parts in the loop itself
FILTERED_PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:"
    "{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}{{ p['text'] }}|{% endfor %};"
    "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)


def test_a_template_that_loops_over_filtered_or_sliced_parts_gets_them_too(tokenizer):
    # vLLM's "auto" looks through a filter, a test or a slice on the looped content; the
    # detection did not, so these templates got one string, whose characters selectattr drops
    # (or the slice cuts): every message rendered empty ("u:;a:;A:"), without an error.
    assert render_chat(tokenizer, CONVERSATION, chat_template=FILTERED_PARTS_TEMPLATE) == "u:hi|;a:Yo|;A:"
    sliced = FILTERED_PARTS_TEMPLATE.replace(
        "m['content'] | selectattr('type', 'equalto', 'text')", "m.content[:8]"
    )
    assert render_chat(tokenizer, CONVERSATION, chat_template=sliced) == "u:hi|;a:Yo|;A:"
    named = (
        "{% for m in messages %}{% set parts = m['content'] | list %}{{ m['role'][0] }}:"
        "{% for p in parts %}{{ p['text'] }}|{% endfor %};{% endfor %}"
    )
    assert (
        render_chat(tokenizer, CONVERSATION, chat_template=named, add_generation_prompt=False)
        == "u:hi|;a:Yo|;"
    )


def test_chat_template_content_format_forces_either_form_and_is_checked(tokenizer):
    string = render_chat(
        tokenizer, CONVERSATION, chat_template=PARTS_TEMPLATE, chat_template_content_format="string"
    )
    assert string == "u:;a:;A:"  # asked for: each message's content is one string
    openai = render_chat(
        tokenizer,
        CONVERSATION,
        chat_template="{{ messages[0]['content'] }}",
        chat_template_content_format="openai",
    )
    assert openai == str([{"type": "text", "text": "hi"}])
    _raises(
        "chat_template_content_format",
        "one of 'auto', 'string', 'openai'",
        render_chat,
        tokenizer,
        CONVERSATION,
        chat_template=TEMPLATE,
        chat_template_content_format="text",
    )


# ---- chat_template ------------------------------------------------------------------------------


def test_chat_template_replaces_the_tokenizers_and_one_is_needed(tokenizer):
    _raises("chat_template", "no chat template", render_chat, tokenizer, CONVERSATION)
    assert render_chat(tokenizer, CONVERSATION, chat_template="{{ messages[1]['content'] }}") == "Yo"
    _raises("chat_template", "non-empty", render_chat, tokenizer, CONVERSATION, chat_template=" ")
    _raises(
        "chat_template", "not a valid Jinja", render_chat, tokenizer, CONVERSATION, chat_template="{% if %}"
    )
    failing = "{{ raise_exception('no') }}"
    _raises(
        "messages", "failed on these messages", render_chat, tokenizer, CONVERSATION, chat_template=failing
    )


def test_chat_without_a_tokenizer_says_so_even_with_a_template():
    # skip_tokenizer_init: a chat prompt must be tokenized, so a template alone cannot help; the
    # error said "pass chat_template" to a caller who had passed one.
    for template in (None, "{{ messages[0]['content'] }}"):
        _raises("tokenizer", "skip_tokenizer_init", render_chat, None, CONVERSATION, chat_template=template)


# ---- add_generation_prompt / continue_final_message ---------------------------------------------


def test_continue_final_message_ends_the_prompt_inside_the_assistants_message(tokenizer):
    kw = dict(chat_template=TEMPLATE, add_generation_prompt=False)
    assert render_chat(tokenizer, CONVERSATION, **kw) == "u:hi;a:Yo;"
    assert render_chat(tokenizer, CONVERSATION, continue_final_message=True, **kw) == "u:hi;a:Yo"
    assert render_chat(tokenizer, CONVERSATION, chat_template=TEMPLATE) == "u:hi;a:Yo;A:"


def test_continue_final_message_errors_are_vllms(tokenizer):
    both = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    kw = dict(chat_template=TEMPLATE, continue_final_message=True)
    _raises("continue_final_message", both.replace("`", "."), render_chat, tokenizer, CONVERSATION, **kw)
    user_last = CONVERSATION + [{"role": "user", "content": "q"}]
    _raises(
        "continue_final_message",
        "last message to be the assistant's, got role 'user'",
        render_chat,
        tokenizer,
        user_last,
        add_generation_prompt=False,
        **kw,
    )
    for name in ("continue_final_message", "add_generation_prompt"):
        _raises(
            name,
            "must be a bool",
            render_chat,
            tokenizer,
            CONVERSATION,
            chat_template=TEMPLATE,
            **{name: "content"},
        )


# ---- chat_template_kwargs -----------------------------------------------------------------------


def test_chat_template_kwargs_reach_the_template(tokenizer):
    template = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}" + TEMPLATE
    assert render_chat(tokenizer, CONVERSATION, chat_template=template).startswith("u:")
    off = render_chat(
        tokenizer, CONVERSATION, chat_template=template, chat_template_kwargs={"enable_thinking": False}
    )
    assert off == "/no_think u:hi;a:Yo;A:"
    # the arguments of these names win over chat_template_kwargs (vLLM merges them so)
    kwargs = {"add_generation_prompt": False, "continue_final_message": True}
    assert render_chat(tokenizer, CONVERSATION, chat_template=TEMPLATE, chat_template_kwargs=kwargs).endswith(
        "A:"
    )


def test_an_assistants_reasoning_and_empty_tool_calls_reach_the_template_as_vllm_passes_them(tokenizer):
    """A reply sent back as the server answered it: its `reasoning` is the template's
    `reasoning_content` too (Qwen3's template reads that name), and a null or empty tool_calls
    is no tool_calls (a template testing `'tool_calls' in m` would drop the content)."""
    template = (
        "{% for m in messages %}{{ m['role'][0] }}:"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{% if 'tool_calls' in m %}C{% else %}{{ m['content'] }}{% endif %};{% endfor %}"
    )
    replies = [
        {"role": "assistant", "content": "Yo", "reasoning": "r", "tool_calls": calls} for calls in (None, [])
    ]
    prompt = render_chat(
        tokenizer, [CONVERSATION[0], *replies], chat_template=template, add_generation_prompt=False
    )
    assert prompt == "u:hi;a:<think>r</think>Yo;a:<think>r</think>Yo;"


def test_chat_template_kwargs_the_call_sets_itself_are_refused(tokenizer):
    kw = dict(chat_template=TEMPLATE)
    for name in ("chat_template", "tokenize", "messages", "conversation", "tools", "documents"):
        _raises(
            "chat_template_kwargs",
            f"unexpected chat template kwargs.*'{name}'",
            render_chat,
            tokenizer,
            CONVERSATION,
            chat_template_kwargs={name: 1},
            **kw,
        )
    for bad in ([("x", 1)], {1: 2}):
        _raises(
            "chat_template_kwargs",
            "dict with str keys",
            render_chat,
            tokenizer,
            CONVERSATION,
            chat_template_kwargs=bad,
            **kw,
        )


# ---- LLM.chat -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm():
    from enginespec.llm import LLM

    return LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=64)


GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _chat(llm, messages, **kwargs):
    return llm.chat(messages, GREEDY, use_tqdm=False, chat_template=TEMPLATE, **kwargs)


def test_llm_chat_flattens_content_parts_like_the_server(llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "yo"}]}]
    got = _chat(llm, parts)[0]
    want = _chat(llm, [{"role": "user", "content": "hi\nyo"}])[0]
    assert got.prompt == want.prompt == "u:hi\nyo;A:"
    assert (
        got.prompt_token_ids == want.prompt_token_ids
        and got.outputs[0].token_ids == want.outputs[0].token_ids
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(ValueError, match="only text content parts"):
        _chat(llm, [{"role": "user", "content": [image]}])


def test_llm_chat_takes_vllms_chat_keywords(llm):
    out = _chat(llm, CONVERSATION, add_generation_prompt=False, continue_final_message=True)[0]
    tok = llm.get_tokenizer()
    assert out.prompt == "u:hi;a:Yo" and out.prompt_token_ids == tok.encode(
        "u:hi;a:Yo", add_special_tokens=False
    )
    template = "{{ greeting }}" + TEMPLATE
    out = llm.chat(
        CONVERSATION, GREEDY, use_tqdm=False, chat_template=template, chat_template_kwargs={"greeting": "G"}
    )
    assert out[0].prompt == "Gu:hi;a:Yo;A:"
    with pytest.raises(ValueError, match="Cannot set both"):
        _chat(llm, CONVERSATION, continue_final_message=True)
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    with pytest.raises(TypeError):  # keyword-only: vLLM's fourth positional is lora_request
        llm.chat(CONVERSATION, GREEDY, False, TEMPLATE)


def test_llm_chat_takes_chat_template_content_format(llm):
    # vLLM's keyword of LLM.chat was a TypeError; "auto" (its default) detects the parts template
    prompts = [
        _chat(llm, CONVERSATION, chat_template_content_format=fmt)[0].prompt for fmt in ("auto", "string")
    ]
    assert prompts == ["u:hi;a:Yo;A:"] * 2
    out = llm.chat(CONVERSATION, GREEDY, use_tqdm=False, chat_template=PARTS_TEMPLATE)[0]
    assert out.prompt == "u:hi|;a:Yo|;A:"


def test_a_tokenizer_with_named_templates_renders_the_one_transformers_picks():
    # transformers keeps several named templates as a dict (tokenizer_config's list of {name,
    # template}): "default", or "tool_use" when tools are given, or the one chat_template names.
    # The content-format detection took the dict itself: a TypeError (unhashable type: 'dict')
    # out of every chat call, a 500 on the server; before it, apply_chat_template got the dict
    # as its chat_template and failed the same way.
    tok = load_tokenizer(tiny_model_dir("qwen3"))
    tok.chat_template = {"default": PARTS_TEMPLATE, "tool_use": TEMPLATE}
    assert render_chat(tok, CONVERSATION) == "u:hi|;a:Yo|;A:"  # "default", detected as parts
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert render_chat(tok, CONVERSATION, tools=tools) == "u:hi;a:Yo;A:"
    assert render_chat(tok, CONVERSATION, chat_template="tool_use") == "u:hi;a:Yo;A:"
    tok.chat_template = {"tool_use": TEMPLATE}
    _raises("chat_template", "no default", render_chat, tok, CONVERSATION)


# vLLM's words for a tokenizer without a chat template (its ValueError, the server's 400)
VLLM_NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
    "chat template if the tokenizer does not define one."
)


def test_no_chat_template_is_vllms_error_naming_chat_template(tokenizer):
    """Without a template anywhere, LLM.chat's error carries vLLM's sentence (clients that
    fall back to completions for a base model match on it) and names chat_template."""
    err = _raises("chat_template", "no chat template", render_chat, tokenizer, CONVERSATION)
    assert str(err).startswith(VLLM_NO_TEMPLATE), str(err)
