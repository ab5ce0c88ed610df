"""LLM.generate's use_tqdm as vLLM takes it: True (tqdm's bar), False (none), or a callable made
in tqdm's place with tqdm's keyword arguments (functools.partial(tqdm, file=...), a custom bar
class): a vLLM program that passes one gets its own bar, updated once a finished prompt."""

from __future__ import annotations

import functools
import io

import pytest
from tqdm import tqdm

from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [{"prompt_token_ids": [5, 6, 7 + i]} for i in range(3)]
PARAMS = SamplingParams(max_tokens=2, temperature=0)


def test_a_callable_use_tqdm_makes_the_bar():
    llm = LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=32)
    made = []

    def bar(**kwargs):
        made.append(kwargs)
        return tqdm(**kwargs, file=sink)

    sink = io.StringIO()
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=bar)
    assert len(outs) == 3 and made and made[0]["total"] == 3
    assert "Processed prompts" in sink.getvalue() and "3/3" in sink.getvalue()
    other = io.StringIO()
    chat = [{"role": "user", "content": "hi"}]
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert llm.chat(chat, PARAMS, use_tqdm=functools.partial(tqdm, file=other), chat_template=template)
    assert "1/1" in other.getvalue()


def test_a_callable_use_tqdm_gets_vllms_keywords_and_keeps_its_own():
    """vLLM calls the callable with total, desc, dynamic_ncols and postfix, nothing more. Ours
    also passed unit and disable=False: those overrode the ones a functools.partial had bound
    (partial(tqdm, disable=not main_rank) drew its bar anyway), and a bar function written for
    vLLM's four keywords was a TypeError."""
    llm = LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=32)
    hidden = io.StringIO()
    assert (
        len(llm.generate(PROMPTS, PARAMS, use_tqdm=functools.partial(tqdm, file=hidden, disable=True))) == 3
    )
    assert hidden.getvalue() == ""
    sink = io.StringIO()

    def vllm_shaped(total, desc, dynamic_ncols, postfix):
        return tqdm(total=total, desc=desc, dynamic_ncols=dynamic_ncols, postfix=postfix, file=sink)

    assert len(llm.generate(PROMPTS, PARAMS, use_tqdm=vllm_shaped)) == 3
    assert "Processed prompts" in sink.getvalue() and "3/3" in sink.getvalue()


class RecordingBar:
    """A use_tqdm callable's bar that keeps its updates, postfixes and closes."""

    def __init__(self, **kwargs):
        self.kwargs, self.updates, self.postfixes, self.closed = kwargs, [], [], 0

    def update(self, n: int = 1) -> None:
        self.updates.append(n)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfixes.append(text)

    def close(self) -> None:
        self.closed += 1


def test_the_bar_counts_prompts_and_shows_output_tokens_per_second(monkeypatch):
    """One update per finished prompt, the postfix the output tokens so far over the seconds
    since the call began (a clock stood in: 2 s after the start at every reading), and the bar
    closed once at the end."""
    import enginespec.llm as llm_module

    llm = LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=32)
    readings = iter([100.0])
    clock = type("Clock", (), {"perf_counter": staticmethod(lambda: next(readings, 102.0))})
    monkeypatch.setattr(llm_module, "time", clock)
    bars = []
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=lambda **kw: bars.append(RecordingBar(**kw)) or bars[-1])
    (bar,) = bars
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    assert bar.updates == [1, 1, 1] and bar.closed == 1
    assert bar.postfixes[-1] == f"output {total / 2.0:.1f} tok/s"


def test_generate_shows_tqdms_bar_by_default(capsys):
    """vLLM's default: use_tqdm=True, tqdm's bar on stderr."""
    llm = LLM(str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", num_blocks=32)
    llm.generate(PROMPTS, PARAMS)
    assert "Processed prompts" in capsys.readouterr().err


def test_both_bars_follow_the_terminals_width(monkeypatch):
    """generate()'s bar is made as vLLM makes it, dynamic_ncols=True (it redraws to the
    terminal's width), whether tqdm's own or a use_tqdm callable's; use_tqdm=False makes none."""
    from enginespec import llm as llm_module
    from enginespec.beam_search import NoProgressBar

    made = []
    monkeypatch.setattr(llm_module, "tqdm", lambda **kwargs: made.append(kwargs) or "tqdm's")
    assert llm_module._progress_bar(True, 3) == "tqdm's"
    assert llm_module._progress_bar(lambda **kwargs: made.append(kwargs) or "theirs", 3) == "theirs"
    assert [(kwargs["total"], kwargs["dynamic_ncols"]) for kwargs in made] == [(3, True), (3, True)]
    assert isinstance(llm_module._progress_bar(False, 3), NoProgressBar)
