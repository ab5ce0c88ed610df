"""benchmarks/engine_host_overhead.py on a CPU: its figure is host ms per step with every
request decoding, so no request may finish inside the timed steps (an empty step is almost
free, and averaging it in understated the figure: `--steps 1000` printed a fifth of the real
cost); a count below 1 is a flag error, and --help describes every flag."""

from __future__ import annotations

import pytest

from benchmarks import engine_host_overhead as overhead
from enginespec import llm as llm_module


@pytest.fixture
def engines(monkeypatch):
    """Every LLM the script builds, in order."""
    built = []

    class Recorded(llm_module.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(overhead, "LLM", Recorded)
    return built


@pytest.mark.parametrize(
    "spec",
    [None, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}],
    ids=["plain", "ngram"],
)
def test_every_request_still_decodes_after_more_steps_than_its_old_length(engines, spec, torch_one_thread):
    """250 timed steps after the 8 warm-up steps: past the 200 tokens the requests used to ask
    for (they finished, and the last steps timed an idle engine)."""
    ms = overhead.host_ms_per_step("fast", True, 2, 250, spec)
    assert ms > 0
    engine = engines[-1].engine
    assert engine.num_unfinished == 2
    assert len(engine.scheduler.running) == 2


@pytest.mark.parametrize("flag", ["--steps", "--num-requests"])
def test_a_count_below_one_is_a_flag_error(flag, capsys, engines):
    with pytest.raises(SystemExit) as done:
        overhead.main(["--impls", "fast", "--num-requests", "1", "--steps", "1", flag, "0"])
    assert done.value.code == 2
    assert flag in capsys.readouterr().err
    assert engines == []  # refused before any engine was built


def test_help_describes_every_flag(capsys):
    parser = overhead.build_parser()
    undescribed = [a.option_strings for a in parser._actions if not a.help]
    assert undescribed == []
    with pytest.raises(SystemExit) as done:
        overhead.main(["--help"])
    assert done.value.code == 0
    assert "--steps" in capsys.readouterr().out
