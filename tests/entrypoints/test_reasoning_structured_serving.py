"""Structured outputs with reasoning (vLLM's): under --reasoning-parser a constrained chat reply
that starts in its thinking thinks freely and follows the constraint after `</think>`; the
thinking is `reasoning`, the constrained part `content` (or the forced `tool_calls`), in the full
body and in the stream. The handlers run over an in-process engine on the tiny model whose
tokenizer writes JSON and `</think>` as one token (testing.checkpoints.reasoning_model_dir); a
bias on that token makes the random model close its thinking after a few tokens."""

from __future__ import annotations

import asyncio
import json

import pytest

from enginespec.entrypoints.openai.protocol import ChatCompletionRequest
from enginespec.entrypoints.openai.reasoning import END, end_token_ids, get_parser
from enginespec.entrypoints.openai.serving import ServerContext, create_chat_completion
from enginespec.testing.checkpoints import VOCAB_SIZE, reasoning_model_dir
from tests.entrypoints.client_helpers import in_process_client, never

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, max_num_seqs=4, block_size=4)
OPEN = "{% for m in messages %}{{ m['content'] }};{% endfor %}A:<think>\n"  # the template opens it
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 4}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
THINK_END_ID = VOCAB_SIZE - 1
THINKING = {str(THINK_END_ID): 3.0}  # `</think>` after a few tokens (it cannot fit a 4-char name)
TOOLS = [{"type": "function", "function": {"name": "person", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def engine(torch_one_thread):
    with in_process_client(reasoning_model_dir(), **ENGINE) as client:
        yield client


def _chat(engine, stream: bool = False, ctx_end_ids="auto", **fields):
    """The choice (or the streamed choices) of one seeded chat request under the qwen3 parser
    and a template that opens the thinking."""
    ctx = ServerContext(
        engine, engine.tokenizer, ["tiny"], 128, chat_template=OPEN, reasoning_parser=get_parser("qwen3")
    )
    if ctx_end_ids != "auto":
        ctx.reasoning_end_ids = ctx_end_ids  # as a tokenizer without a stable `</think>` gives
    base = {"max_tokens": 60, "temperature": 1.0, "seed": 3, "logit_bias": THINKING, "stream": stream}
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **{**base, **fields})

    async def run():
        engine.start(asyncio.get_running_loop())
        result = await create_chat_completion(ctx, body, never)
        if not stream:
            return result["choices"][0]
        frames = [f async for f in result][:-1]  # [DONE] last
        return [c for f in frames for c in json.loads(f[len("data: ") :])["choices"]]

    return asyncio.run(run())


def _person(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 4


def _joined(choices: list[dict], key: str):
    return "".join(c["delta"].get(key) or "" for c in choices) or None


def test_the_end_tag_is_one_stable_token():
    """The premise: the server's marker is the tokenizer's id of `</think>`."""
    from transformers import AutoTokenizer

    assert end_token_ids(AutoTokenizer.from_pretrained(str(reasoning_model_dir()))) == (THINK_END_ID,)


@pytest.mark.parametrize(
    "fields",
    [{"response_format": JSON_SCHEMA}, {"structured_outputs": {"json": SCHEMA}}],
    ids=["response_format", "structured_outputs"],
)
def test_a_constrained_reply_thinks_first_and_its_answer_is_the_content(engine, fields):
    """The model thinks (free text the schema refuses), closes with `</think>`, then writes the
    schema's JSON: `reasoning` is the thinking, `content` the JSON, in the full body and the
    stream alike. Before, the grammar governed from the first token and the split was off."""
    choice = _chat(engine, **fields)
    message = choice["message"]
    assert message["reasoning"] and _person(message["content"]), message
    assert choice["finish_reason"] == "stop"
    streamed = _chat(engine, stream=True, **fields)
    assert _joined(streamed, "reasoning") == message["reasoning"]
    assert _joined(streamed, "content") == message["content"]
    assert END not in json.dumps(streamed)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "person"}}])
def test_forced_tool_calls_come_after_the_thinking(engine, tool_choice):
    """tool_choice "required" or a named function: the calls are read from the part after
    `</think>`, and the thinking is the reasoning."""
    # free JSON strings from random weights rarely close: a bias towards '"', '}' and ']' (after
    # the mask), and a stronger one towards `</think>` so that the thinking still closes
    close = {str(i): 3.0 for i in engine.tokenizer.encode('"}]', add_special_tokens=False)}
    close[str(THINK_END_ID)] = 5.0
    for stream in (False, True):
        got = _chat(
            engine, stream=stream, tools=TOOLS, tool_choice=tool_choice, max_tokens=100, logit_bias=close
        )
        if stream:
            calls = [c["function"] for ch in got for c in ch["delta"].get("tool_calls", ())]
            reasoning, finish = _joined(got, "reasoning"), got[-1]["finish_reason"]
        else:
            calls = [c["function"] for c in got["message"]["tool_calls"]]
            reasoning, finish = got["message"]["reasoning"], got["finish_reason"]
        assert reasoning and calls, got
        assert all(c["name"] == "person" and _person(c["arguments"]) for c in calls), calls
        assert finish == ("tool_calls" if tool_choice == "required" else "stop")


def test_a_reply_that_starts_closed_follows_the_grammar_from_its_first_token(engine):
    """enable_thinking false: the reply has no thinking; the grammar governs it from the first
    token and it is all content, as before (`</think>` is never drawn: the schema refuses it)."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = _chat(engine, response_format=JSON_SCHEMA, **off)["message"]
    assert message["reasoning"] is None and _person(message["content"]), message


def test_thinking_cut_off_by_max_tokens_ends_for_length_without_content(engine):
    """A reply that never closes its thinking (`</think>` biased away) is all reasoning, cut
    at max_tokens: "length", no content, and the grammar never masked it."""
    choice = _chat(engine, response_format=JSON_SCHEMA, max_tokens=12, logit_bias={str(THINK_END_ID): -100})
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert len(choice["message"]["reasoning"]) >= 12 and not choice["message"]["reasoning"].startswith("{")


def test_without_stable_end_ids_the_grammar_governs_the_whole_reply(engine):
    """A tokenizer that writes `</think>` differently in different contexts gives no marker:
    the split is off and the grammar governs from the first token (the reply is the JSON)."""
    message = _chat(engine, ctx_end_ids=None, response_format=JSON_SCHEMA)["message"]
    assert "reasoning" not in message and _person(message["content"]), message


class _MergingTokenizer:
    """A BPE-like stub: `</think>` is three tokens alone, but "a<" merges into one before it."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith("a<", i):
                ids.append(1000)
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def decode(self, ids) -> str:
        return "".join("a<" if t == 1000 else chr(t) for t in ids)


def test_an_end_tag_whose_ids_change_with_its_neighbours_has_no_marker():
    assert end_token_ids(_MergingTokenizer()) is None


class _BosTokenizer:
    """The tiny model's tokenizer adding a BOS (<s>, id 2) whenever special tokens are asked
    for, as Llama's and DeepSeek-R1-Distill's tokenizers do by default."""

    def __init__(self, inner):
        self.inner = inner

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.inner.encode(text, add_special_tokens=False)
        return [self.inner.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids) -> str:
        return self.inner.decode(ids)


def test_a_tokenizer_that_adds_a_bos_still_has_the_tag_s_own_ids_as_marker():
    """The marker is the tag's ids without the BOS a Llama-like tokenizer adds (encoded with
    special tokens, `<s></think>` decodes to no end tag and there was no marker at all)."""
    from transformers import AutoTokenizer

    tokenizer = _BosTokenizer(AutoTokenizer.from_pretrained(str(reasoning_model_dir())))
    assert tokenizer.encode(END) == [tokenizer.inner.bos_token_id, THINK_END_ID]  # the premise
    assert end_token_ids(tokenizer) == (THINK_END_ID,)


class _UnknownSlashTokenizer:
    """A character-level stub with no `/` in its vocabulary: it writes `/` as <unk> (id 0),
    which decodes to `?`. Its ids for `</think>` are the same in every context."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0 if c == "/" else ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join("?" if t == 0 else chr(t) for t in ids)


def test_an_end_tag_whose_ids_do_not_decode_back_to_it_has_no_marker():
    """Ids that decode to another text (`<?think>`) are no marker: the split looks for the tag's
    text, so a grammar started on those ids would start where the split sees no end."""
    assert _UnknownSlashTokenizer().decode(_UnknownSlashTokenizer().encode(END)) == "<?think>"
    assert end_token_ids(_UnknownSlashTokenizer()) is None


@pytest.mark.parametrize("ids", [[-1], [], [VOCAB_SIZE]])
def test_a_bad_start_marker_from_the_client_is_a_400(engine, ids):
    from enginespec.entrypoints.openai.errors import APIError

    with pytest.raises(APIError, match="start_after_token_ids") as info:
        _chat(engine, structured_outputs={"json": SCHEMA, "start_after_token_ids": ids})
    assert info.value.status == 400, info.value
