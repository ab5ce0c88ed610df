"""vLLM's argparse parser for scripts, at both of its import paths: `vllm.utils` (vLLM <= 0.10:
basic/generate.py, basic/chat.py, llm_engine_example.py) and `vllm.utils.argparse_utils` (later
releases). With only the import changed to enginespec, each script was a ModuleNotFoundError."""

from __future__ import annotations

import pytest

from enginespec import EngineArgs


def test_both_vllm_import_paths_give_the_parser():
    from enginespec.utils import FlexibleArgumentParser
    from enginespec.utils.argparse_utils import FlexibleArgumentParser as Later

    assert FlexibleArgumentParser is Later


def test_it_reads_vllms_underscore_and_dotted_spellings_as_the_cli_does():
    from enginespec.utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(description="a vLLM example"))
    ns = parser.parse_args(
        ["--max_model_len=64", "--max_num_seqs", "8", "--speculative-config.method", "ngram"]
    )
    args = EngineArgs.from_cli_args(ns)
    assert (args.max_model_len, args.max_num_seqs) == (64, 8)
    assert args.speculative_config == {"method": "ngram"}


def test_a_bad_dotted_flag_is_argparse_usage_error(capsys):
    from enginespec.utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="example"))
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--speculative-config..x", "1"])
    assert exit_info.value.code == 2
    assert "--speculative-config..x: empty key" in capsys.readouterr().err
