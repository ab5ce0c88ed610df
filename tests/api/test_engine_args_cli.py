"""vLLM's command-line route into an engine: `EngineArgs.add_cli_args(parser)` then
`EngineArgs.from_cli_args(ns)` (llm_engine_example.py) or `LLM(**vars(ns))` (generate.py and
chat.py, which pop their own sampling flags first). Each was an AttributeError here, so none of
those scripts ran with only the import changed."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from enginespec import LLM, EngineArgs, SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_cli_args_parse_into_engine_args_under_vllms_flag_names():
    parser = argparse.ArgumentParser()
    assert EngineArgs.add_cli_args(parser) is parser
    given = ["--model", "m", "--max-model-len", "4k", "--max-num-seqs", "8", "--no-enable-prefix-caching"]
    args = EngineArgs.from_cli_args(parser.parse_args([*given, "--dtype", "float32"]))
    assert args == EngineArgs(
        model="m", max_model_len=4000, max_num_seqs=8, enable_prefix_caching=False, dtype="float32"
    )
    assert EngineArgs.from_cli_args(parser.parse_args([])) == EngineArgs()


def test_the_namespace_is_engine_args_keywords_and_a_scripts_own_flags_are_left_out():
    """Every dest is a field (LLM(**vars(ns)) would refuse any other name), and a script's own
    flag beside them does not reach EngineArgs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=None)
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["--max-tokens", "3"])
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(vars(ns)) == fields | {"max_tokens"}
    assert EngineArgs.from_cli_args(ns) == EngineArgs()
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineArgs.from_cli_args(parser.parse_args(["--max-num-seqs", "0"]))


def test_generate_py_flow_on_an_argument_group(impl):
    """generate.py's shape: the engine flags in an argument group whose model default the script
    sets, its sampling flags popped, the rest passed to LLM as keywords."""
    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("Engine arguments")
    EngineArgs.add_cli_args(group)
    group.set_defaults(model=str(tiny_model_dir("qwen3")))
    parser.add_argument_group("Sampling parameters").add_argument("--max-tokens", type=int)
    argv = ["--dtype", "float32", "--device", "cpu", "--num-blocks", "32", "--max-tokens", "3"]
    args = vars(parser.parse_args(argv))
    max_tokens = args.pop("max_tokens")
    args["impl"] = impl  # the implementation under test, where a script would pass --impl
    llm = LLM(**args)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.engine.args.num_blocks == 32 and llm.engine.args.dtype == "float32"
