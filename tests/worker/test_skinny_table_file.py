"""worker/skinny_table_file.py: a LinearTable's choices saved and loaded (ENGINESPEC_SKINNY_TABLE).

On CPU: a saved table loads back equal; a file measured elsewhere (another fingerprint), for
fewer rows, or unreadable is ignored with a warning naming it; and install() with a file that
covers the decoder tunes nothing, wires the layers, and tunes (then saves) only what a file
lacks. Timing needs a GPU, so `LinearTable.tune_variants` is replaced by a recorder here; the CUDA test
in test_skinny_linear.py runs the real tuning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from enginespec.kernels.skinny_gemm import SkinnyConfig
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker import skinny_linear as sl
from enginespec.worker import skinny_ops
from enginespec.worker import skinny_table_file as tf
from enginespec.worker.flat_model import FlatModel

GEMV = SkinnyConfig(block_n=4, block_k=1024, use_dot=False, gemv=True)
TILED = SkinnyConfig(block_n=64, block_k=256, num_splits=8)


def _table(max_rows: int = 8) -> sl.LinearTable:
    table = sl.LinearTable("cpu", max_rows=max_rows)
    table.choices[(1, 4096, 1024, torch.bfloat16, False, "norm")] = sl.Choice(GEMV, 2.9, 4.5)
    table.choices[(8, 1024, 3072, torch.bfloat16, False, "residual")] = sl.Choice(TILED, 6.1, 8.8)
    table.choices[(4, 6144, 1024, torch.float16, True, "plain")] = sl.Choice(None, 6.1, 6.1)
    return table


def test_a_saved_table_loads_back_equal(tmp_path):
    path = tmp_path / "sub" / "table.json"
    table = _table()
    assert tf.save(table, path)
    again = sl.LinearTable("cpu", max_rows=8)
    assert tf.load(again, path) == 3
    assert again.choices == table.choices
    assert not list(path.parent.glob("*.tmp")), "the temp file is renamed, not left"
    smaller = sl.LinearTable("cpu", max_rows=4)  # a file for more rows serves fewer: the rest left out
    assert tf.load(smaller, path) == 2
    assert all(key[0] <= 4 for key in smaller.choices)


def test_a_path_that_cannot_be_written_warns_and_leaves_nothing(tmp_path, caplog):
    """A directory where the file should be (os.replace fails after the temp file is written):
    save warns naming the path and returns False, and removes its temp file."""
    path = tmp_path / "table.json"
    path.mkdir()
    (path / "keep").write_text("")  # a non-empty directory: nothing may replace it
    with caplog.at_level(logging.WARNING):
        assert tf.save(_table(), path) is False
    assert str(path) in caplog.text and "could not save" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]


def test_no_file_is_the_first_run(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert tf.load(sl.LinearTable("cpu"), tmp_path / "absent.json") == 0
    assert not caplog.records


@pytest.mark.parametrize(
    "edit,reason",
    [
        (lambda d: d["fingerprint"].update(torch="0.0.1"), "measured elsewhere"),
        (lambda d: d["fingerprint"].update(kernel="0" * 16), "measured elsewhere"),
        (lambda d: d.update(max_rows=4), "tuned up to 4 rows, 8 needed"),
        (lambda d: d["choices"][0].update(variant="bogus"), "unreadable"),
        (lambda d: d["choices"][0]["config"].update(block_n=3), "unreadable"),
        (lambda d: d.pop("choices"), "unreadable"),
    ],
    ids=["torch", "kernel", "rows", "variant", "config", "shape"],
)
def test_a_file_that_does_not_apply_is_ignored_with_a_warning(tmp_path, caplog, edit, reason):
    path = tmp_path / "table.json"
    tf.save(_table(), path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    table = sl.LinearTable("cpu", max_rows=8)
    with caplog.at_level(logging.WARNING):
        assert tf.load(table, path) == 0
    assert not table.choices
    assert any(str(path) in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_a_file_tuned_with_other_candidates_is_ignored(tmp_path, caplog, monkeypatch):
    """New launch shapes offered by worker/gemm_tuning.py (another source there) make a saved
    table stale: it is ignored with a warning, so the next start times the new shapes."""
    from enginespec.worker import gemm_tuning

    path = tmp_path / "table.json"
    tf.save(_table(), path)
    source_hash = tf._source_hash
    monkeypatch.setattr(tf, "_source_hash", lambda m: "f" * 16 if m is gemm_tuning else source_hash(m))
    table = sl.LinearTable("cpu", max_rows=8)
    with caplog.at_level(logging.WARNING):
        assert tf.load(table, path) == 0
    assert not table.choices and "measured elsewhere" in caplog.text


def test_not_json_is_ignored(tmp_path, caplog):
    path = tmp_path / "table.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert tf.load(sl.LinearTable("cpu"), path) == 0
    assert "unreadable" in caplog.text


def test_path_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv(tf.TABLE_ENV, raising=False)
    assert tf.path_from_env() is None
    for off in ("  ", "0"):
        monkeypatch.setenv(tf.TABLE_ENV, off)
        assert tf.path_from_env() is None
        assert tf.table_path("cpu") is None
    monkeypatch.setenv(tf.TABLE_ENV, str(tmp_path / "t.json"))
    assert tf.path_from_env() == tmp_path / "t.json"
    assert tf.table_path("cpu") == tmp_path / "t.json"


def test_default_table_path_is_in_the_cache_folder_by_fingerprint(monkeypatch, tmp_path):
    """Unset, the table lives in enginespec's cache folder under a name that changes with the
    fingerprint (a second start finds it; another torch, triton or kernel source does not)."""
    monkeypatch.delenv(tf.TABLE_ENV, raising=False)
    monkeypatch.setenv(tf.CACHE_ENV, str(tmp_path / "cache"))
    path = tf.table_path("cpu")
    assert path.parent == tmp_path / "cache" and path.name.startswith("skinny_table-")
    assert tf.table_path("cpu") == path
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert tf.table_path("cpu") != path
    monkeypatch.delenv(tf.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tf.table_path("cpu").parent == tmp_path / "xdg" / "enginespec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tf.cache_dir() == Path.home() / ".cache" / "enginespec"


def test_no_home_directory_falls_back_to_the_temp_dir(monkeypatch):
    """A process with no home to resolve still gets a cache folder (the temp dir's), rather than
    an error that would turn the whole skinny GEMM off."""
    import tempfile

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    for name in (tf.CACHE_ENV, "XDG_CACHE_HOME", tf.TABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert tf.cache_dir() == Path(tempfile.gettempdir()) / "enginespec-cache"
    assert tf.table_path("cpu").parent == tf.cache_dir()


def test_an_unreadable_folder_is_no_table(tmp_path, monkeypatch, caplog):
    """load() of a path whose existence cannot even be checked (a permission error) tunes as
    without a file, with a warning naming the path."""

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "exists", denied)
    with caplog.at_level(logging.WARNING):
        assert tf.load(sl.LinearTable("cpu"), tmp_path / "t.json") == 0
    assert "t.json" in caplog.text


def _decoder_choices(layers, max_rows: int, skip: str = "") -> dict:
    """A choice for every (bucket, group, variant) install() would tune, but `skip`'s."""
    choices = {}
    for variant in sl.VARIANTS:
        for group in skinny_ops.tuning_groups(layers, variant) if variant != skip else ():
            for bucket in (b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_rows):
                choices[(bucket, *group, variant)] = sl.Choice(TILED, 1.0, 2.0)
    return choices


@pytest.mark.parametrize(
    "skip, where",
    [("", "env"), ("norm_silu", "env"), ("norm_silu", "cache")],
    ids=["covered", "one-variant-missing", "default-file-one-variant-missing"],
)
def test_install_tunes_only_what_the_file_lacks(impl, monkeypatch, tmp_path, skip, where):
    """where: the file named by ENGINESPEC_SKINNY_TABLE, or (env unset) the cache folder's."""
    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    layers = model.merged.layers
    monkeypatch.setenv(tf.CACHE_ENV, str(tmp_path / "cache"))
    if where == "env":
        path = tmp_path / "table.json"
        monkeypatch.setenv(tf.TABLE_ENV, str(path))
    else:
        monkeypatch.delenv(tf.TABLE_ENV, raising=False)
        path = tf.table_path("cpu")
    saved = sl.LinearTable("cpu", max_rows=8)
    saved.choices.update(_decoder_choices(layers, 8, skip))
    tf.save(saved, path)
    tuned = []

    def fake_tune_variants(self, work, buckets=None):
        for groups, variant in work:
            tuned.append(variant)
            for group in groups:
                for bucket in (1, 2, 4, 8):
                    self.choices[(bucket, *group, variant)] = sl.Choice(GEMV, 0.5, 2.0)

    monkeypatch.setattr(sl.LinearTable, "tune_variants", fake_tune_variants)
    monkeypatch.delitem(skinny_ops._TABLES, torch.device("cpu"), raising=False)
    for layer in layers:  # install() rewires them; monkeypatch puts them back afterwards
        monkeypatch.setattr(layer, "linear", layer.linear)
        monkeypatch.setattr(layer, "fused_linear", layer.fused_linear)
    try:
        table = skinny_ops.install(model.merged, "cpu", max_rows=8)
    finally:
        skinny_ops._TABLES.pop(torch.device("cpu"), None)
    assert tuned == ([skip] if skip else [])
    assert all(layer.linear is torch.ops.enginespec.linear for layer in layers)
    assert set(table.choices) == set(_decoder_choices(layers, 8))
    reloaded = sl.LinearTable("cpu", max_rows=8)
    tf.load(reloaded, path)
    assert reloaded.choices == table.choices  # saved back with what was tuned (or left as it was)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_second_start_on_cuda_loads_what_the_first_tuned(impl, monkeypatch, tmp_path):
    """The real tuning saves the table; a fresh process's table (the registry emptied) loads
    every choice back, with the same fingerprint, and tunes nothing."""
    model = FlatModel.from_pretrained(
        tiny_model_dir("qwen3"), attention=impl.attention_backend("cuda"), dtype=torch.bfloat16, device="cuda"
    )
    path = tmp_path / "table.json"
    monkeypatch.setenv(tf.TABLE_ENV, str(path))
    device = skinny_ops._device_key("cuda")
    monkeypatch.delitem(skinny_ops._TABLES, device, raising=False)
    first = skinny_ops.install(model.merged, "cuda", max_rows=4)
    assert path.exists()
    skinny_ops._TABLES.pop(device)

    def no_tuning(*args, **kwargs):
        raise AssertionError("a covered decoder must not be tuned again")

    monkeypatch.setattr(sl.LinearTable, "tune_variants", no_tuning)
    try:
        second = skinny_ops.install(model.merged, "cuda", max_rows=4)
        assert second.choices == first.choices
    finally:
        skinny_ops._TABLES.pop(device, None)
