"""chat_utils.render_chat, the one renderer of LLM.chat and the server: content parts,
chat_template, and their errors; then LLM.chat over it (one tiny engine for the module)."""

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


def test_parts_render_as_their_joined_string(tokenizer):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    plain = [{"role": "user", "content": "a\nb"}]
    assert render_chat(tokenizer, parts, chat_template=TEMPLATE) == "u:a\nb;A:"
    assert render_chat(tokenizer, parts, chat_template=TEMPLATE) == render_chat(
        tokenizer, plain, chat_template=TEMPLATE
    )
    _raises("messages", "must be a dict", render_chat, tokenizer, ["hi"], chat_template=TEMPLATE)


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


# ---- LLM.chat -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm():
    from enginespec.llm import LLM

    return LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=64)


GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _chat(llm, messages):
    llm.get_tokenizer().chat_template = TEMPLATE
    return llm.chat(messages, GREEDY, use_tqdm=False)


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
