"""FlexibleArgumentParser: vLLM's argparse parser for scripts (`vllm.utils.argparse_utils`)."""

from __future__ import annotations

import argparse
import sys

from enginespec.entrypoints.cli import merge_dotted, vllm_spelling


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An argparse.ArgumentParser that reads vLLM's spellings of a flag as the `enginespec`
    commands do (entrypoints/cli.py `vllm_spelling`): an option name with underscores means
    the dashed one (`--max_model_len=64` is `--max-model-len 64`), and a JSON object flag may be
    given key by key (`--speculative-config.num_speculative_tokens 3`). Pair it with
    `EngineArgs.add_cli_args(parser)`, as vLLM's example scripts do. A malformed dotted key is
    argparse's usage error (exit 2), as any bad flag is. vLLM's `--config FILE` (flags from a
    YAML file) and `-O` (its compilation level) are not read: the engine has no flag of either."""

    def parse_known_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        try:
            argv, dotted = vllm_spelling(argv)
        except argparse.ArgumentTypeError as e:
            self.error(str(e))
        ns, rest = super().parse_known_args(argv, namespace)
        merge_dotted(self, ns, dotted)
        return ns, rest
