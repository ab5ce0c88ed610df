"""benchmarks/table_variant.py: a pinned table with picks replaced, loadable as the engine loads it."""

from __future__ import annotations

import json

import pytest

from benchmarks import table_variant
from enginespec.worker import skinny_table_file


def _row(rows: int, n: int, k: int, variant: str, config, us: float, baseline_us: float) -> dict:
    """One entry as skinny_table_file.save writes it (bf16, no bias)."""
    return dict(rows=rows, n=n, k=k, dtype="bfloat16", bias=False, variant=variant, config=config, us=us,
                baseline_us=baseline_us)  # fmt: skip


def _doc() -> dict:
    gemv = dict(block_n=1, block_k=4096, num_splits=1, use_dot=False, num_warps=8, num_stages=3, gemv=True)
    rows = [
        _row(1, 1024, 3072, "residual", dict(gemv), 3.0, 5.6),
        _row(2, 1024, 3072, "residual", dict(gemv), 3.2, 6.2),
        _row(1, 6144, 1024, "plain", None, 6.1, 6.1),  # a baseline pick
    ]
    return {"fingerprint": {"format": 1}, "max_rows": 16, "choices": rows}


def test_a_set_changes_only_its_entries_and_keeps_the_rest_of_the_shape(tmp_path):
    base, out = tmp_path / "base.json", tmp_path / "out.json"
    base.write_text(json.dumps(_doc()))
    assert (
        table_variant.main([str(base), str(out), "--set", "1,1024,3072,residual=num_warps:4,block_n:2"]) == 0
    )
    got, want = json.loads(out.read_text()), _doc()
    want["choices"][0]["config"].update(num_warps=4, block_n=2)
    assert got == want
    # the engine's loader reads the variant back (its rows parse into keys and SkinnyConfigs)
    key, choice = skinny_table_file._entry(got["choices"][0])
    assert key[:3] == (1, 1024, 3072) and (choice.config.block_n, choice.config.num_warps) == (2, 4)


def test_a_baseline_pick_takes_a_whole_shape():
    doc = _doc()
    shape = "block_n:4,block_k:1024,num_splits:1,use_dot:0,num_warps:4,num_stages:3,gemv:1"
    (entry,) = table_variant.apply(doc, *table_variant.parse_set(f"1,6144,1024,plain={shape}"))
    assert entry["config"]["block_n"] == 4 and entry["config"]["gemv"] is True
    with pytest.raises(ValueError, match="baseline"):
        table_variant.apply(_doc(), *table_variant.parse_set("1,6144,1024,plain=num_warps:4"))


@pytest.mark.parametrize(
    "text, match",
    [
        ("1,1024,3072=num_warps:4", "--set takes"),
        ("1,1024,3072,residual", "--set takes"),
        ("1,1024,3072,residual=warps:4", "is not one of"),
        ("1,1024,3072,residual=gemv:yes", "is not one of"),
    ],
)
def test_bad_sets_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        table_variant.parse_set(text)


def test_no_matching_entry_or_a_bad_shape_exits_2(tmp_path, capsys):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_doc()))
    assert (
        table_variant.main([str(base), str(tmp_path / "o.json"), "--set", "4,1024,3072,residual=num_warps:4"])
        == 2
    )
    assert "no entry for rows=4" in capsys.readouterr().err
    assert (
        table_variant.main([str(base), str(tmp_path / "o.json"), "--set", "1,1024,3072,residual=block_n:3"])
        == 2
    )
    assert "power of two" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
