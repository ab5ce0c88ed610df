"""enginespec inside someone else's program (a service, a notebook, a pipeline, a test suite):
its log lines go to loggers under `enginespec` and nowhere else, it configures no logger (no
handler, no level: the host's logging setup decides what shows, as for any library; only
`enginespec serve` gives `enginespec` a handler), it prints nothing to stdout, and it leaves
torch's global random generator to the host (the engine draws from generators of its own).
The README says how to see the log lines, under the same logger name."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re
import sys
from pathlib import Path

import pytest
import torch

import enginespec
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

README = Path(__file__).resolve().parents[2] / "README.md"


def _loggers_of_our_modules() -> dict[str, str]:
    """Module name -> the name of each logging.Logger a module of ours holds at its top level
    (every product module imported, the server's too)."""
    for info in pkgutil.walk_packages(enginespec.__path__, "enginespec."):
        if not info.name.startswith("enginespec.conformance"):  # pytest's, never the product's
            importlib.import_module(info.name)
    return {
        f"{name}.{attr}": value.name
        for name, module in list(sys.modules.items())
        if name == "enginespec" or name.startswith("enginespec.")
        for attr, value in vars(module).items()
        if isinstance(value, logging.Logger)
    }


def test_every_logger_of_ours_is_under_the_name_the_readme_tells_hosts_to_configure():
    """The README said nothing of logging: a host could not tell which logger to raise to
    INFO, or that vLLM's logging variables do nothing here."""
    named = re.findall(r'logging\.getLogger\("([\w.]+)"\)', README.read_text())
    assert named == ["enginespec"], f"the README names the loggers {named}, not the one namespace"
    loggers = _loggers_of_our_modules()
    assert loggers, "the walk found none of our loggers"
    foreign = {where: name for where, name in loggers.items() if not name.startswith("enginespec.")}
    assert not foreign, f"loggers of ours outside the enginespec namespace: {foreign}"


def _logging_setup() -> dict:
    manager = logging.root.manager
    loggers = [logging.root, *(v for v in manager.loggerDict.values() if isinstance(v, logging.Logger))]
    return {lg.name: (lg.level, tuple(lg.handlers), lg.propagate, lg.disabled) for lg in loggers}


def test_building_and_using_an_llm_configures_no_logger_and_prints_nothing(capsys):
    """Every logger that existed before (the root, torch's, transformers', ours) keeps its
    handlers and level; the loggers made meanwhile are plain; nothing reaches stdout."""
    before = _logging_setup()
    with LLM(str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", block_size=4, num_blocks=32) as llm:
        llm.generate(["hi"], SamplingParams(max_tokens=3), use_tqdm=False)
        llm.chat(
            [{"role": "user", "content": "hi"}],
            SamplingParams(max_tokens=3),
            use_tqdm=False,
            chat_template="{{ messages[0]['content'] }}",
        )
    after = _logging_setup()
    changed = {name: (was, after[name]) for name, was in before.items() if after[name] != was}
    assert not changed, f"loggers configured by building an LLM: {changed}"
    ours_configured = {  # made meanwhile (an earlier test in this process may have run `serve`'s setup)
        name: setup
        for name, setup in after.items()
        if name.startswith("enginespec") and name not in before and setup[:2] != (0, ())
    }
    assert not ours_configured
    assert capsys.readouterr().out == ""


def test_building_an_llm_leaves_the_hosts_torch_random_stream_as_it_was():
    """EngineCore called torch.manual_seed(seed) (seed 0 unless given): every LLM a host built
    restarted the host's own torch random stream at seed 0, so a pipeline or test suite that
    seeded torch for its own draws got the same numbers after each LLM, whatever its seed. No
    draw of the engine's came from that stream (the sampler and the draft verifier have their
    own generators, seeded by EngineArgs.seed)."""
    torch.manual_seed(1234)
    want = torch.rand(4)
    torch.manual_seed(1234)
    llm = LLM(
        str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", block_size=4, num_blocks=32, seed=0
    )
    assert torch.equal(torch.rand(4), want)
    torch.manual_seed(1234)
    sampled = llm.generate(["hi"], SamplingParams(max_tokens=4, temperature=1.0), use_tqdm=False)
    assert torch.equal(torch.rand(4), want)
    again = LLM(
        str(tiny_model_dir("qwen3")), dtype="float32", device="cpu", block_size=4, num_blocks=32, seed=0
    )
    torch.manual_seed(99)  # the host's seed does not reach the engine's draws either
    redrawn = again.generate(["hi"], SamplingParams(max_tokens=4, temperature=1.0), use_tqdm=False)
    assert redrawn[0].outputs[0].token_ids == sampled[0].outputs[0].token_ids
