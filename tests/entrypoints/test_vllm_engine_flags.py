"""vLLM's engine flags of everyday serve lines that change nothing here: --compilation-config / -O
(the compiled decoder with CUDA graphs is the engine's own), --max-num-partial-prefills 1,
--structured-outputs-config / --guided-decoding-backend auto, --config-format auto|hf; and
--[no-]enable-sleep-mode (the engine's sleep mode, tests/api/test_sleep_mode.py). Each was
argparse's "unrecognized arguments" (exit 2); now vLLM's default values reach EngineArgs and any
other value is EngineArgs' one line "not supported by enginespec" naming the argument and what
is accepted (exit 2, before any model loads). --hf-overrides takes any JSON object (and vLLM's
dotted form) into EngineArgs (what it does: tests/api/test_hf_overrides.py)."""

from __future__ import annotations

import json

import pytest

from enginespec.engine_args import EngineArgs
from enginespec.entrypoints import cli

ACCEPTED = [
    (["--compilation-config", "{}"], "compilation_config", {}),
    (["--compilation-config", "3"], "compilation_config", 3),
    (["--compilation-config", '{"level": 3}'], "compilation_config", {"level": 3}),
    (["--compilation-config.mode", "3"], "compilation_config", {"mode": 3}),  # vLLM's dotted form
    (["-O3"], "optimization_level", 3),
    (["-O", "2"], "optimization_level", 2),
    (["--optimization-level", "1"], "optimization_level", 1),
    (["--hf-overrides", "{}"], "hf_overrides", {}),
    (["--hf-overrides", '{"rope_theta": 1e6}'], "hf_overrides", {"rope_theta": 1e6}),
    (
        ["--hf-overrides.rope_scaling.factor", "4", "--hf_overrides.max_position_embeddings=8192"],
        "hf_overrides",
        {"rope_scaling": {"factor": 4}, "max_position_embeddings": 8192},
    ),
    (["--max-num-partial-prefills", "1"], "max_num_partial_prefills", 1),
    (
        ["--structured-outputs-config", '{"backend": "auto"}'],
        "structured_outputs_config",
        {"backend": "auto"},
    ),
    (
        ["--structured_outputs_config.disable_any_whitespace", "false"],  # vLLM's underscores, dotted
        "structured_outputs_config",
        {"disable_any_whitespace": False},
    ),
    (["--guided-decoding-backend", "auto"], "guided_decoding_backend", "auto"),
    (["--no-enable-sleep-mode"], "enable_sleep_mode", False),
    (["--enable-sleep-mode"], "enable_sleep_mode", True),  # sleep mode: tests/api/test_sleep_mode.py
    (["--config-format", "hf"], "config_format", "hf"),
]

REFUSED = [
    (["--compilation-config", "0"], r"compilation_config \{'level': 0\} is not supported by enginespec"),
    (["--compilation-config", '{"cudagraph_mode": "NONE"}'], "compilation_config {'cudagraph_mode'"),
    (["-O0"], r"optimization_level=0 .* pass enforce_eager=True \(--enforce-eager\)"),
    (["-O4"], r"optimization_level must be an int in \[0, 3\]"),
    (["--hf-overrides", "[1, 2]"], r"hf_overrides must be None or a dict of config.json keys, got \[1, 2\]"),
    (["--max-num-partial-prefills", "2"], r"max_num_partial_prefills=2 is not supported .*accepted: \[1\]"),
    (
        ["--structured-outputs-config.backend", "xgrammar"],
        "structured_outputs_config {'backend': 'xgrammar'}",
    ),
    (["--guided-decoding-backend", "outlines"], r"guided_decoding_backend='outlines' is not supported"),
    (
        ["--config-format", "mistral"],
        r"config_format='mistral' is not supported .*accepted: \['auto', 'hf'\]",
    ),
]


def _engine_args(flags: list[str]) -> EngineArgs:
    argv, dotted = cli.vllm_spelling(["serve", "/m", *flags])
    parser = cli._parser()
    ns = parser.parse_args(argv)
    cli.merge_dotted(parser, ns, dotted)
    return EngineArgs.from_kwargs(ns.model, **cli._engine_kwargs(ns))


@pytest.mark.parametrize("flags, field, value", ACCEPTED)
def test_vllms_default_values_reach_engine_args(flags, field, value):
    assert getattr(_engine_args(flags), field) == value


@pytest.mark.parametrize("flags, message", REFUSED)
def test_other_values_are_one_line_before_any_load(flags, message, capsys):
    with pytest.raises(ValueError, match=message):
        _engine_args(flags)
    assert cli.main(["serve", "/nonexistent/model", *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("enginespec serve: error: ") and "\n" not in err and "does not exist" not in err


def test_the_engine_defaults_are_vllms():
    args = EngineArgs()
    assert (args.compilation_config, args.optimization_level, args.hf_overrides) == (None, None, None)
    assert (args.max_num_partial_prefills, args.enable_sleep_mode, args.config_format) == (1, False, "auto")
    assert (args.structured_outputs_config, args.guided_decoding_backend) == (None, "auto")
    assert EngineArgs(compilation_config={"mode": "VLLM_COMPILE"}).compilation_config == {
        "mode": "VLLM_COMPILE"
    }
    with pytest.raises(ValueError, match="compilation_config must be None, a level"):
        EngineArgs(compilation_config="3")


@pytest.mark.parametrize(
    "key, default, other",
    [
        ("backend", "auto", "guidance"),
        ("disable_fallback", False, True),
        ("disable_any_whitespace", False, True),
        ("disable_additional_properties", False, True),
        ("reasoning_parser", "", "deepseek_r1"),
    ],
)
def test_each_structured_outputs_key_is_taken_at_vllms_default_only(key, default, other):
    """vLLM's StructuredOutputsConfig keys change what a grammar allows (whitespace, extra
    properties, the reasoning split): each is taken at its default, dotted or as JSON, and any
    other value is the one line naming the key (it would otherwise be dropped without a word)."""
    taken = _engine_args([f"--structured-outputs-config.{key}", json.dumps(default)])
    assert taken.structured_outputs_config == {key: default}
    refused = rf"structured_outputs_config \{{'{key}': {other!r}\}} is not supported"
    for flags in (
        [f"--structured-outputs-config.{key}", json.dumps(other)],
        ["--structured-outputs-config", json.dumps({key: other})],
    ):
        with pytest.raises(ValueError, match=refused):
            _engine_args(flags)


@pytest.mark.parametrize("bad", [True, 1.0, "1", 0])
def test_max_num_partial_prefills_is_an_int(bad):
    """1 is vLLM V1's only value, and only the int: True and 1.0 equal 1 but are refused by name,
    as every other int argument refuses them (they were taken as 1)."""
    with pytest.raises(ValueError, match=rf"max_num_partial_prefills must be an int >= 1, got {bad!r}"):
        EngineArgs(max_num_partial_prefills=bad)
