"""Scripts that add their own flags to a shared parser (throughput.py's, decode_sweep.py's) list
them under --help. benchmarks/README.md sends readers to host_phases.py's `--tail N`,
`--sync-debug`, `--gc`, ...; its --help printed only throughput.py's flags, so none of them showed
(the same in pressure.py, startup.py and generate_b1_probe.py)."""

from __future__ import annotations

import importlib

import pytest

OWN_FLAG = [
    ("benchmarks.host_phases", "--sync-debug"),
    ("benchmarks.pressure", "--fraction"),
    ("benchmarks.startup", "--cache-root"),
    ("benchmarks.generate_b1_probe", "--cprofile"),
]


@pytest.mark.parametrize("module, flag", OWN_FLAG, ids=[m for m, _ in OWN_FLAG])
def test_help_lists_the_scripts_own_flags_and_the_shared_ones(module, flag, capsys):
    script = importlib.import_module(module)
    with pytest.raises(SystemExit) as done:
        script.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert flag in out, out
    assert "--shape" in out  # the shared parser's help still follows
