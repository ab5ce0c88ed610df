"""The checkpoint loader: weights land where transformers puts them, and every broken checkpoint
fails with an error that names the file or tensor at fault. Never a download."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from enginespec.testing.checkpoints import VOCAB_SIZE, make_checkpoint, tiny_model_dir
from enginespec.worker.loader import (
    SUPPORTED_ARCHITECTURES,
    CheckpointError,
    CheckpointNotFound,
    build_model,
    checkpoint_files,
    load_config,
    load_tokenizer,
    load_tokenizer_dir,
)


def _hf_state(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _copy(family: str, tmp_path: Path, tied: bool = False) -> Path:
    dest = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir(family, tied), dest)
    return dest


def _rewrite(path: Path, edit) -> None:
    """Load model.safetensors, apply `edit` to the dict, save it back."""
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("tied", [False, True])
def test_weights_equal_transformers_own_load(family, tied):
    path = tiny_model_dir(family, tied)
    model = build_model(path)
    ours = model.state_dict()
    theirs = _hf_state(path)
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert (head is embed) == tied
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def test_tied_checkpoint_stores_no_head_tensor():
    files = checkpoint_files(tiny_model_dir("qwen3", True))
    names = set().union(*(load_file(str(f)).keys() for f in files))
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_is_applied_to_every_weight(dtype):
    model = build_model(tiny_model_dir("qwen2"), dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # as transformers keeps it


def test_a_weight_beyond_float16s_range_is_refused_in_float16_naming_dtype(tmp_path):
    """A weight over 65504 cast to float16 became inf: the model loaded, and every token it
    then generated came from NaN logits (token 0, empty text, finish_reason "length", no error).
    Loading in float16 now names the tensor and dtype; bfloat16 holds the same checkpoint."""
    path = _copy("qwen3", tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"

    def enlarge(tensors):
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = 1e5

    _rewrite(path, enlarge)
    with pytest.raises(ValueError, match=rf"dtype.*float16.*{name}|{name}.*dtype.*float16"):
        build_model(path, dtype=torch.float16)
    model = build_model(path, dtype=torch.bfloat16)
    assert torch.isfinite(model.model.layers[0].mlp.down_proj.weight).all()


def test_sharded_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    source = tiny_model_dir("mistral")
    AutoModelForCausalLM.from_pretrained(str(source)).save_pretrained(str(tmp_path), max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert [f.name for f in checkpoint_files(tmp_path)] == shards
    ours = build_model(tmp_path).state_dict()
    for name, tensor in _hf_state(source).items():
        assert torch.equal(ours[name], tensor), name
    (tmp_path / shards[-1]).unlink()
    with pytest.raises(CheckpointNotFound, match=shards[-1]):
        build_model(tmp_path)


@pytest.mark.parametrize(
    "body",
    [
        {"weight_map": {}},
        {"weight_map": ["model.safetensors"]},
        {},
        {"weight_map": {"a": 5}},
        {"weight_map": {"a": "model.safetensors", "b": None}},
        ["model.safetensors"],
    ],
    ids=["empty", "a-list", "missing", "a-number-for-a-shard", "a-null-for-a-shard", "no-object"],
)
def test_an_index_without_a_usable_weight_map_is_refused_naming_it(tmp_path, body):
    """A model.safetensors.index.json whose weight_map is not a non-empty object of shard file
    names is a CheckpointError naming the index and weight_map, never another exception (a
    number for a shard was a TypeError from the path join; an index that is a JSON list an
    AttributeError) nor a checkpoint of no files."""
    path = _copy("qwen3", tmp_path)
    (path / "model.safetensors.index.json").write_text(json.dumps(body))
    match = r"model\.safetensors\.index\.json: .*(weight_map|JSON object)"
    with pytest.raises(CheckpointError, match=match):
        checkpoint_files(path)


@pytest.mark.parametrize("text", ["[1]", '"qwen3"', "null"])
def test_a_config_json_holding_no_object_is_refused_naming_it(tmp_path, text):
    """config.json that is JSON but no object: a CheckpointError naming config.json (it was an
    AttributeError, 'list' object has no attribute 'get')."""
    path = _copy("qwen3", tmp_path)
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"config\.json: must hold a JSON object"):
        build_model(path)


def test_missing_directory_never_downloads():
    with pytest.raises(CheckpointNotFound, match="does not exist") as info:
        build_model("Qwen/Qwen3-0.6B")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_weight_file_linked_to_nothing_is_named_as_a_broken_link(tmp_path, sharded):
    """A hub cache snapshot whose blob is gone (an interrupted or pruned download) holds a
    symlink to nothing: it was "corrupt safetensors file ...: No such file or directory" (a
    whole file may be fine once fetched again) or, in a sharded checkpoint, "missing"."""
    path = _copy("qwen3", tmp_path)
    name = "model.safetensors"
    if sharded:
        name = "model-00001-of-00001.safetensors"
        (path / "model.safetensors").rename(path / name)
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": name}}))
    (path / name).unlink()
    (path / name).symlink_to("../../blobs/gone")
    with pytest.raises(
        CheckpointNotFound, match=f"{name} is a link to ../../blobs/gone, which does not exist"
    ):
        build_model(path)


@pytest.mark.parametrize("given", ["config.json", "model.safetensors"])
def test_a_file_given_for_the_directory_is_named_as_a_file(tmp_path, given):
    """A file of the checkpoint given for its directory: said to be a file (it was "does not
    exist", though it does)."""
    path = _copy("qwen3", tmp_path) / given
    with pytest.raises(CheckpointError, match="is a file, not a directory") as info:
        build_model(path)
    assert str(path) in str(info.value)


def test_an_empty_path_is_not_the_current_directory(tmp_path, monkeypatch):
    """ "" is refused by name: Path("") is ".", so it loaded whatever checkpoint the current
    directory held (and otherwise said ". has no config.json")."""
    monkeypatch.chdir(_copy("qwen3", tmp_path))
    for given in ("", " "):
        with pytest.raises(CheckpointNotFound, match="non-empty path"):
            build_model(given)
        with pytest.raises(CheckpointNotFound, match="non-empty path"):
            load_tokenizer_dir(given)


def test_a_tokenizer_that_fails_to_load_is_one_line_naming_its_directory(tmp_path, monkeypatch):
    """Whatever transformers raises for broken tokenizer files (its converter's error is several
    lines; a JSON error names no file) is a one-line CheckpointError naming the directory."""
    import transformers

    path = _copy("qwen3", tmp_path)

    def broken(*args, **kwargs):
        raise OSError("Couldn't instantiate the backend tokenizer from one of:\n(1) a file,\n(2) ...")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", broken)
    for load in (load_tokenizer, load_tokenizer_dir):
        with pytest.raises(CheckpointError, match=f"cannot load the tokenizer in {path}: Couldn't") as info:
            load(path)
        assert "\n" not in str(info.value)


def test_a_sentencepiece_only_tokenizer_without_sentencepiece_names_the_package(tmp_path, monkeypatch):
    """A tokenizer shipped as tokenizer.model alone (a SentencePiece model, no tokenizer.json:
    older Llama 2 / Mistral derivatives) needs the sentencepiece package to be converted;
    without it transformers 5 falls back to reading the file as tiktoken's, and the error said
    "`tiktoken` is required ... pip install tiktoken", a package that cannot read it. It now
    names sentencepiece (vLLM installs it with itself, so its users never meet this)."""
    import sys

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # not importable, installed or not
    path = tmp_path / "sp-only"
    path.mkdir()
    (path / "tokenizer.model").write_bytes(b"\x0a\x05<unk>" * 4)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(CheckpointError, match="pip install sentencepiece") as info:
        load_tokenizer_dir(path)
    assert str(path) in str(info.value) and "tokenizer.model" in str(info.value)
    (path / "tokenizer.model").write_bytes(b"IQ== 0\nIg== 1\n")  # tiktoken's format: its error stands
    with pytest.raises(CheckpointError) as info:
        load_tokenizer_dir(path)
    assert "pip install sentencepiece" not in str(info.value)


def test_the_sentencepiece_hint_is_only_for_a_tokenizer_model_alone(tmp_path, monkeypatch):
    """The hint names what a tokenizer.model without a tokenizer.json lacks; beside a
    tokenizer.json (which transformers reads first) it would blame the wrong file, and without a
    tokenizer.model there is no file to read: a directory holding only a broken
    tokenizer_config.json is the same one-line CheckpointError, with no hint and no
    FileNotFoundError of its own."""
    import sys

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # not importable, installed or not
    path = tmp_path / "tok"
    path.mkdir()
    (path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=f"cannot load the tokenizer in {path}: ") as info:
        load_tokenizer_dir(path)
    assert "pip install sentencepiece" not in str(info.value)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    (path / "tokenizer.model").write_bytes(b"\x0a\x05<unk>" * 4)
    (path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=f"cannot load the tokenizer in {path}: ") as info:
        load_tokenizer_dir(path)
    assert "pip install sentencepiece" not in str(info.value)


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointNotFound, match="config.json"):
        build_model(tmp_path)


def test_unsupported_architecture_lists_supported(tmp_path):
    path = _copy("qwen3", tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel") as info:
        build_model(path)
    assert all(arch in str(info.value) for arch in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize(
    "quant", [{"quant_method": "fp8", "weight_block_size": [128, 128]}, {"quant_method": "awq"}]
)
def test_a_quantized_checkpoint_is_refused_by_name(tmp_path, quant):
    """An FP8 or AWQ export (config.json's quantization_config) is refused before any tensor is
    read, naming its method; it failed on its first scale tensor as an "unexpected tensor"."""
    path = _copy("qwen3", tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"quantized.*{quant['quant_method']}"):
        build_model(path)


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_an_unknown_rope_type_is_refused_by_name(tmp_path, key):
    """A rope type transformers has no function for (Phi-3's legacy "su", a typo) is a
    CheckpointError naming it and the supported ones; it was a bare KeyError('su') from the
    model's rotary module."""
    path = _copy("llama", tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config[key] = {"type": "su", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"config\.json: unsupported rope_type 'su'; supported: .*'yarn'"
    ):
        build_model(path)


def test_no_weight_files(tmp_path):
    path = _copy("qwen3", tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointNotFound, match="safetensors"):
        build_model(path)


@pytest.mark.parametrize(
    "names",
    [["pytorch_model.bin"], ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]],
    ids=["one-file", "sharded"],
)
def test_pytorch_bin_weights_alone_are_named_with_what_is_loaded(tmp_path, names):
    """A checkpoint saved in PyTorch's pickle format (pytorch_model.bin, or its shards: older
    fine-tunes, which vLLM also loads) has weights, but none the loader reads. The error said
    only that the directory had no *.safetensors file, as if the weights were missing; it now
    names the .bin file found, says only safetensors are loaded and how to convert."""
    path = _copy("llama", tmp_path)
    (path / "model.safetensors").unlink()
    (path / "training_args.bin").write_bytes(b"not weights")  # a fine-tune's: never named
    with pytest.raises(CheckpointNotFound) as alone:
        build_model(path)
    assert "training_args" not in str(alone.value) and "safetensors only" not in str(alone.value)
    for name in names:
        (path / name).write_bytes(b"not read")
    with pytest.raises(
        CheckpointNotFound,
        match=rf"no \*\.safetensors file.*{re.escape(names[0])}.*safetensors only.*save_pretrained",
    ) as info:
        build_model(path)
    assert ("and more" in str(info.value)) == (len(names) > 1)  # the first file named, the rest counted


def test_missing_tensor_is_named(tmp_path):
    path = _copy("qwen2", tmp_path)
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.1\.self_attn\.k_proj\.bias"):
        build_model(path)


def test_untied_checkpoint_without_head_is_missing_a_tensor(tmp_path):
    path = _copy("llama", tmp_path)
    _rewrite(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"lm_head\.weight"):
        build_model(path)


def test_unexpected_tensor_is_named(tmp_path):
    path = _copy("qwen3", tmp_path)
    _rewrite(path, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match=r"unexpected.*model\.layers\.0\.mlp\.extra\.weight"):
        build_model(path)


def test_wrong_shape_is_named(tmp_path):
    path = _copy("qwen3", tmp_path)
    _rewrite(path, lambda t: t.update({"model.norm.weight": torch.ones(31)}))
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*\[31\].*\[32\]"):
        build_model(path)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_file_is_named(tmp_path, damage):
    path = _copy("mistral", tmp_path)
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(b"\x07not a safetensors file" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt safetensors file .*model.safetensors"):
        build_model(path)


def test_tokenizer_beside_checkpoint(tmp_path):
    tok = load_tokenizer(tiny_model_dir("qwen3"))
    assert len(tok) == VOCAB_SIZE
    ids = tok.encode("hello!", add_special_tokens=False)
    assert tok.decode(ids) == "hello!"
    bare = make_checkpoint("llama", tmp_path / "bare")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    assert load_tokenizer(bare) is None


def test_rotary_cos_sin_caches_in_a_checkpoint_are_skipped(tmp_path):
    """Checkpoints trained with ColossalAI store each layer's rotary cos_cached / sin_cached
    beside inv_freq: recomputed buffers, not weights. transformers loads such a checkpoint and
    vLLM skips them by name; they were an "unexpected tensor" error here."""
    path = _copy("llama", tmp_path)
    extra = {
        f"model.layers.{i}.self_attn.rotary_emb.{name}": torch.ones(8, 16)
        for i in range(2)
        for name in ("cos_cached", "sin_cached")
    }
    _rewrite(path, lambda t: t.update(extra))
    ours = build_model(path).state_dict()
    for name, tensor in _hf_state(tiny_model_dir("llama")).items():
        assert torch.equal(ours[name], tensor), name


def _set_config(path: Path, **fields) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))


def test_an_architecture_naming_another_family_than_model_type_builds_model_types_class(tmp_path):
    """config.json's architectures and model_type name different supported families (a Mistral
    exported as "LlamaForCausalLM"): the model is the class of the config model_type builds, as
    transformers' AutoModelForCausalLM chooses, with transformers' weights. It was a bare
    AttributeError ('MistralConfig' object has no attribute 'attention_bias') from inside
    LlamaForCausalLM's constructor."""
    path = _copy("mistral", tmp_path)
    _set_config(path, architectures=["LlamaForCausalLM"])
    model = build_model(path)
    assert type(model).__name__ == "MistralForCausalLM"
    ours = model.state_dict()
    for name, tensor in _hf_state(path).items():
        assert torch.equal(ours[name], tensor), name


def test_a_model_type_of_no_supported_family_is_one_line_naming_it(tmp_path):
    """A supported architecture over a config of another family (model_type "gemma") is refused
    naming config.json, the model_type and the architecture (LlamaForCausalLM over a GemmaConfig
    built and silently computed a Llama); a model_type transformers does not know is one line
    naming config.json (transformers' own message was three lines and named no file)."""
    path = _copy("llama", tmp_path)
    _set_config(path, model_type="gemma")
    with pytest.raises(CheckpointError, match=r"config\.json.*model_type 'gemma'.*LlamaForCausalLM") as info:
        build_model(path)
    assert "\n" not in str(info.value)
    _set_config(path, model_type="qwen9")
    with pytest.raises(CheckpointError, match=r"config\.json.*qwen9") as info:
        build_model(path)
    assert "\n" not in str(info.value)


def test_architectures_given_as_one_string_is_that_architecture(tmp_path):
    """ "architectures": "LlamaForCausalLM" (a string, not a list: hand-edited configs) loads as
    that architecture, as transformers loads it; its characters were matched one by one, and
    the error said "unsupported architecture LlamaForCausalLM; supported: [..., 'LlamaForCausalLM',
    ...]". Where transformers itself refuses it (5.x validates config fields: a str is no
    list), it is a CheckpointError naming config.json and the field, not transformers' error."""
    path = _copy("llama", tmp_path)
    _set_config(path, architectures="LlamaForCausalLM")
    try:
        theirs = _hf_state(path)
    except Exception as e:  # this transformers refuses the config
        assert "architectures" in str(e)
        with pytest.raises(CheckpointError, match=r"config\.json: cannot build the config: .*architectures"):
            build_model(path)
        return
    ours = build_model(path).state_dict()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("head", ["other values", "other shape"])
def test_a_tied_checkpoint_storing_a_different_head_is_refused_naming_tie_word_embeddings(tmp_path, head):
    """tie_word_embeddings true, and the checkpoint stores an lm_head.weight that is not the
    embedding: the loader dropped it and tied the head to the embedding (vLLM's reading), while
    transformers 5 keeps the stored head, so LLM's logits and transformers' differed entirely
    (greedy tokens too) with no error. It is now a CheckpointError naming the field and the
    tensor; a stored head equal to the embedding still loads, tied."""
    path = _copy("llama", tmp_path, tied=True)

    def store_head(tensors):
        embed = tensors["model.embed_tokens.weight"]
        tensors["lm_head.weight"] = embed + 1 if head == "other values" else embed[:-1].clone()

    _rewrite(path, store_head)
    with pytest.raises(CheckpointError, match=r"tie_word_embeddings.*'lm_head\.weight'"):
        build_model(path)
    _rewrite(path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model = build_model(path)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize(
    "stray, names",
    [
        ("consolidated.safetensors", ["layers.0.attention.wq.weight"]),  # Mistral's own format
        ("adapter_model.safetensors", ["base_model.model.lm_head.lora_A.weight"]),  # a LoRA run's
    ],
)
def test_a_stray_safetensors_file_beside_model_safetensors_is_not_read(tmp_path, stray, names):
    """Without an index, model.safetensors is the checkpoint (transformers' rule): another
    safetensors file beside it (Mistral repositories ship consolidated.safetensors in their own
    naming; a fine-tuning run leaves adapter_model.safetensors) is not read. Every
    *.safetensors file was read, and the first of its tensors failed the load as an
    "unexpected tensor" though transformers loads the directory."""
    path = _copy("mistral", tmp_path)
    save_file({name: torch.zeros(4, 4) for name in names}, str(path / stray))
    assert [f.name for f in checkpoint_files(path)] == ["model.safetensors"]
    ours = build_model(path).state_dict()
    for name, tensor in _hf_state(path).items():
        assert torch.equal(ours[name], tensor), name


def test_an_unknown_hidden_act_is_refused_by_name(tmp_path):
    """A hidden_act transformers has no activation for ("swiglu", which some exports write for
    the SiLU-gated MLP) is a CheckpointError naming config.json, the field and the supported
    ones; it was a bare KeyError('swiglu') from the model's constructor. A supported one other
    than silu loads."""
    path = _copy("llama", tmp_path)
    _set_config(path, hidden_act="swiglu")
    with pytest.raises(CheckpointError, match=r"config\.json: unsupported hidden_act .*supported: .*'silu'"):
        build_model(path)
    _set_config(path, hidden_act="gelu_pytorch_tanh")
    assert build_model(path).model.layers[0].mlp.act_fn is not None


@pytest.mark.parametrize("kv_heads", [3, 8, 0])
def test_kv_heads_that_do_not_divide_the_query_heads_are_refused_naming_them(tmp_path, kv_heads):
    """num_key_value_heads must be >= 1 and divide num_attention_heads (each kv head serves a
    whole group of query heads). A checkpoint written consistently with 4 query heads over 3
    (or 8) kv heads loaded, and every request then finished with finish_reason "error" (the
    backend's "q heads (4) must be a multiple of kv heads (3)" at each step; transformers' own
    forward fails too); 0 kv heads was a bare ZeroDivisionError from the constructor. Now a
    CheckpointError naming config.json, both fields and their values, before any tensor is read."""
    path = make_checkpoint("llama", tmp_path / "ckpt", num_key_value_heads=max(kv_heads, 1))
    _set_config(path, num_key_value_heads=kv_heads)
    match = rf"config\.json: num_attention_heads \(4\) must be a positive multiple of num_key_value_heads \({kv_heads}\)"
    with pytest.raises(CheckpointError, match=match):
        build_model(path)


def test_one_query_head_s_derived_head_dim_is_checked_too(tmp_path):
    """Qwen2 without head_dim over a single query head: the derived hidden_size // 1 is checked
    as any other (5: refused before a tensor is read; transformers' own rope validation lets
    this derivation through)."""
    path = make_checkpoint("qwen2", tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_size=5, num_attention_heads=1, num_key_value_heads=1)
    del config["head_dim"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"head_dim must be an even int >= 2 .*got 5 \(derived"):
        build_model(path)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_zero_query_heads_are_refused_naming_them(tmp_path, family):
    """num_attention_heads 0 over one kv head passed the grouping check (0 is a multiple of 1)
    and building the model raised a bare ZeroDivisionError (Qwen2 without head_dim derives it
    as hidden_size // num_attention_heads; Llama's and Mistral's configs already fail to build,
    a CheckpointError). Now a CheckpointError naming the field and its value, as for 0 kv
    heads."""
    path = make_checkpoint(family, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config.update(num_attention_heads=0, num_key_value_heads=1)
    config.pop("head_dim")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"config\.json: num_attention_heads \(0\) must be a positive multiple"
    ):
        build_model(path)


@pytest.mark.parametrize("wrong", ["short_factor", "long_factor"])
def test_longrope_factors_of_the_wrong_length_are_refused_naming_them(tmp_path, wrong):
    """A longrope scaling holds one short and one long factor per rotated frequency (head_dim / 2
    of them: 8 for the tiny llama's head_dim 16). Five short factors made the model's rotary
    module raise a bare RuntimeError (a broadcast of 5 against 8) while loading; five long
    factors loaded, and then every step holding a context past original_max_position_embeddings
    failed, its requests finishing with finish_reason "error" (transformers only logs a warning
    for either). Now a CheckpointError naming config.json, the field, its length and the one
    expected."""
    path = _copy("llama", tmp_path)
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
    }
    rope[wrong] = [1.5] * 5
    _set_config(path, rope_parameters=rope)
    with pytest.raises(
        CheckpointError, match=rf"config\.json: .*longrope {wrong} must hold 8 numbers.*got 5"
    ):
        build_model(path)


@pytest.mark.parametrize("positions", [0, -5])
def test_a_max_position_embeddings_below_one_is_refused_naming_it(tmp_path, positions):
    """max_position_embeddings is the bound of max_model_len: below 1 no prompt fits. LLM(model=...)
    over -5 raised a bare RuntimeError from torch.arange (the rope table's rows), and over 0
    a ValueError naming SchedulerConfig.max_model_len, not the config field the 0 came from.
    Now a CheckpointError naming config.json, the field and its value."""
    path = _copy("llama", tmp_path)
    _set_config(path, max_position_embeddings=positions)
    with pytest.raises(
        CheckpointError, match=rf"config\.json: max_position_embeddings must be .*>= 2 .*, got {positions}"
    ):
        build_model(path)


def test_a_single_position_is_refused_naming_it_and_two_load(tmp_path):
    """One position holds a one-token prompt and nothing it could generate: the engine's
    max_model_len (and EngineArgs') is at least 2. Over 1 the loader said nothing and
    LLM(model=...) failed with "SchedulerConfig.max_model_len must be None or >= 2, got 1",
    naming a setting the user never gave instead of the config field; 2 is the least that
    loads."""
    path = _copy("llama", tmp_path)
    _set_config(path, max_position_embeddings=1)
    with pytest.raises(
        CheckpointError, match=r"config\.json: max_position_embeddings must be .*>= 2 .*, got 1"
    ):
        build_model(path)
    _set_config(path, max_position_embeddings=2)
    assert load_config(path).max_position_embeddings == 2


@pytest.mark.parametrize(
    "family, head_dim, partial, count",
    [("llama", 16, 0.5, 4), ("llama", 16, 0.75, 6), ("qwen2", None, 1.0, 4)],
    ids=["half", "three-quarters", "no-head-dim"],
)
def test_longrope_factor_count_follows_partial_rotary_factor_and_the_derived_head_dim(
    tmp_path, family, head_dim, partial, count
):
    """The count is transformers' (its rope validation logs the same "must have length"): one
    factor per rotated frequency of head_dim x partial_rotary_factor, head_dim being
    hidden_size // num_attention_heads where the config has none (a Qwen2 config without the
    field: 32 // 4 = 8). The tiny checkpoints rotate all of an explicit head_dim 16, so the
    other test left both the partial factor and the derived head_dim unchecked. The check is
    called alone: load_config refuses any partial_rotary_factor below 1 before it
    (test_a_partial_rotary_factor_is_refused_naming_it)."""
    from transformers import AutoConfig

    from enginespec.worker.loader import _check_longrope_factors

    def check(path):
        _check_longrope_factors(AutoConfig.from_pretrained(str(path)), path / "config.json")

    path = _copy(family, tmp_path)
    config = json.loads((path / "config.json").read_text())
    if head_dim is None:
        del config["head_dim"]
    (path / "config.json").write_text(json.dumps(config))
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    rope |= {"partial_rotary_factor": partial} if partial != 1.0 else {}
    for n in (count, count + 2):
        _set_config(path, rope_parameters=rope | {"short_factor": [1.0] * n, "long_factor": [2.0] * count})
        if n == count:
            check(path)
        else:
            with pytest.raises(CheckpointError, match=rf"short_factor must hold {count} numbers.*got {n}"):
                check(path)


def test_a_transformers_4_config_s_rope_scaling_is_checked_and_none_is_no_scaling():
    """transformers 4 (pyproject's lower bound is 4.51) has no rope_parameters: a config carries
    its scaling in rope_scaling, and None there without one. The check reads rope_scaling where
    rope_parameters is absent, and a config without scaling passes."""
    from types import SimpleNamespace

    from enginespec.worker.loader import _check_longrope_factors

    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 5, "long_factor": [1.0] * 8}
    with pytest.raises(CheckpointError, match=r"config\.json: .*short_factor must hold 8 numbers.*got 5"):
        _check_longrope_factors(SimpleNamespace(rope_scaling=longrope, head_dim=16), Path("config.json"))
    _check_longrope_factors(SimpleNamespace(rope_scaling=None, head_dim=16), Path("config.json"))


@pytest.mark.parametrize("kv_heads", [1, 4], ids=["mqa", "mha"])
def test_one_kv_head_and_one_per_query_head_load(tmp_path, kv_heads):
    """The two ends of the grouping _check_heads allows: a single kv head for all 4 query heads
    (multi-query attention) and one per query head (no grouping) build; the refused values
    (0, 3, 8) are in the test above."""
    path = make_checkpoint("llama", tmp_path / "ckpt", num_key_value_heads=kv_heads)
    model = build_model(path)
    assert model.config.num_key_value_heads == kv_heads


@pytest.mark.parametrize(
    "where, rope",
    [
        ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4}),
        ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
        ("top-level", None),  # the tiny llama's own llama3 scaling
    ],
    ids=["default", "linear", "llama3-top-level"],
)
def test_a_partial_rotary_factor_is_refused_naming_it(tmp_path, where, rope):
    """The supported families' attention (transformers' apply_rotary_pos_emb) rotates every
    dimension of a head. A partial_rotary_factor of 0.5 loaded: under a scaled rope type (the
    llama3 of Llama 3.x, linear, yarn, dynamic) transformers computes cos/sin for half the head
    and every request then finished with finish_reason "error" (a shape mismatch in each step,
    which transformers' own forward raises too); under "default" transformers ignores the field
    and rotates the whole head, a model other than the one the config states (vLLM rotates only
    head_dim x factor dimensions). Now a CheckpointError naming the field; a factor of 1 loads."""
    path = _copy("llama", tmp_path)
    if where == "top-level":
        _set_config(path, partial_rotary_factor=0.5)
    else:
        _set_config(path, rope_parameters=rope | {"partial_rotary_factor": 0.5})
    with pytest.raises(CheckpointError, match=r"config\.json: partial_rotary_factor 0\.5 .*supported: 1\.0"):
        build_model(path)
    if where == "top-level":
        _set_config(path, partial_rotary_factor=1.0)
    else:
        _set_config(path, rope_parameters=rope | {"partial_rotary_factor": 1})
    build_model(path)


@pytest.mark.parametrize(
    "key, value, rope",
    [
        ("rope_theta", 0, {"rope_type": "default"}),
        ("rope_theta", -10000.0, {"rope_type": "default"}),
        ("rope_theta", "10000", {"rope_type": "default"}),
        ("rope_theta", None, {"rope_type": "default"}),
        ("factor", 0, {"rope_type": "linear", "rope_theta": 1e4}),
        ("factor", "2.0", {"rope_type": "linear", "rope_theta": 1e4}),
        ("factor", "2", {"rope_type": "dynamic", "rope_theta": 1e4}),
        ("factor", True, {"rope_type": "linear", "rope_theta": 1e4}),
    ],
    ids=[
        "theta-0",
        "theta-negative",
        "theta-str",
        "theta-null",
        "factor-0",
        "linear-factor-str",
        "dynamic-factor-str",
        "factor-bool",
    ],
)
def test_a_rope_theta_or_factor_that_is_no_positive_number_is_refused_naming_it(tmp_path, key, value, rope):
    """rope_theta and a scaling's factor are positive numbers. A theta of 0 or below, or a factor
    of 0, loaded and made every cos/sin NaN: each request then generated token 0 with NaN
    logprobs, no error (transformers' forward computes the same NaNs). A string or null made the
    model's rotary module raise a bare TypeError ("unsupported operand type(s) for ** or pow():
    'str' and 'Tensor'") while loading. Now a CheckpointError naming config.json, the key and the
    value."""
    path = _copy("llama", tmp_path)
    _set_config(path, rope_parameters=rope | {key: value})
    name = "rope scaling factor" if key == "factor" else key
    with pytest.raises(
        CheckpointError,
        match=rf"config\.json: {name} must be a number > 0.*, got {re.escape(repr(value))}",
    ):
        build_model(path)


@pytest.mark.parametrize(
    "rope",
    [{"rope_type": "default", "rope_theta": 1}, {"rope_type": "linear", "rope_theta": 0.5, "factor": 0.25}],
    ids=["theta-1", "theta-and-factor-below-1"],
)
def test_a_rope_theta_or_factor_between_zero_and_one_loads(tmp_path, rope):
    """The bound is > 0, not >= 1: a theta of 1 (every frequency 1) or below, and a linear factor
    below 1 (positions stretched rather than compressed), are numbers transformers' rotary module
    computes finite cos/sin from, so the checkpoint loads as stated."""
    path = _copy("llama", tmp_path)
    _set_config(path, rope_parameters=rope)
    build_model(path)


def test_a_transformers_4_config_s_rope_theta_is_checked():
    """transformers 4 keeps rope_theta as a config attribute beside rope_scaling (which may be
    None): the check reads it there too."""
    from types import SimpleNamespace

    from enginespec.worker.loader import _check_rope_values

    with pytest.raises(CheckpointError, match=r"rope_theta must be a number > 0.*got 'x'"):
        _check_rope_values(SimpleNamespace(rope_scaling=None, rope_theta="x"), Path("config.json"))
    with pytest.raises(CheckpointError, match=r"rope scaling factor must be a number > 0.*got 0"):
        _check_rope_values(
            SimpleNamespace(rope_scaling={"type": "linear", "factor": 0}, rope_theta=1e4), Path("config.json")
        )
    _check_rope_values(SimpleNamespace(rope_scaling=None, rope_theta=1e6), Path("config.json"))
    _check_rope_values(SimpleNamespace(rope_scaling=None), Path("config.json"))


@pytest.mark.parametrize(
    "family, head_dim",
    [("llama", 0), ("qwen3", -16), ("qwen2", None), ("qwen2", 16.0)],
    ids=["zero", "negative", "qwen2-null", "qwen2-float"],
)
def test_a_head_dim_that_is_no_positive_int_is_refused_naming_it(tmp_path, family, head_dim):
    """head_dim, where config.json gives one, is an int >= 1 (and even: the next test). 0 was a bare ZeroDivisionError ("0.0
    cannot be raised to a negative power") and -16 a RuntimeError ("Trying to create tensor with
    negative dimension") from the model's constructor. Qwen2's config has no head_dim field, so
    transformers keeps what config.json says unchecked: null made the constructor raise a bare
    TypeError (its attention reads head_dim ** -0.5; Llama and Mistral's configs derive null as
    hidden_size // num_attention_heads), 16.0 another TypeError from torch.empty. Now a
    CheckpointError naming config.json, the field and its value; a Qwen2 config without the key
    derives it and loads."""
    path = make_checkpoint(family, tmp_path / "ckpt", hidden_size=64, head_dim=16)
    _set_config(path, head_dim=head_dim)
    with pytest.raises(
        CheckpointError,
        match=rf"config\.json: head_dim must be an even int >= 2 .*, got {re.escape(repr(head_dim))}",
    ):
        build_model(path)
    config = json.loads((path / "config.json").read_text())
    del config["head_dim"]
    (path / "config.json").write_text(json.dumps(config))
    if family != "qwen3":  # Qwen3's config defaults head_dim to 128
        assert build_model(path).model.layers[0].self_attn.head_dim == 16


@pytest.mark.parametrize(
    "family, head_dim, stated",
    [("llama", 1, True), ("qwen3", 3, True), ("qwen2", 3, False)],
    ids=["llama-one", "qwen3-three", "qwen2-derived-three"],
)
def test_an_odd_head_dim_is_refused_naming_it(tmp_path, family, head_dim, stated):
    """The rope rotates a head's dimensions in pairs (cos/sin hold head_dim // 2 frequencies,
    doubled), so an odd head_dim, stated or derived (Qwen2 without the key: hidden_size //
    num_attention_heads), built a model whose every step failed on the shape mismatch
    (transformers' forward fails alike): LLM.generate answered each request with no token and
    finish_reason 'error'. Refused at load, naming config.json, the field and the value; 2, the
    least even one, loads."""

    def checkpoint(name: str, dim: int) -> Path:
        path = make_checkpoint(
            family,
            tmp_path / name,
            hidden_size=12 * dim,
            num_attention_heads=12,
            num_key_value_heads=4,
            head_dim=dim,
        )
        if not stated:
            config = json.loads((path / "config.json").read_text())
            del config["head_dim"]
            (path / "config.json").write_text(json.dumps(config))
        return path

    with pytest.raises(
        CheckpointError, match=rf"config\.json: head_dim must be an even int >= 2 .*, got {head_dim}\b"
    ):
        build_model(checkpoint("odd", head_dim))
    assert build_model(checkpoint("two", 2)).model.layers[0].self_attn.head_dim == 2


@pytest.mark.parametrize(
    "family, fields",
    [
        ("mistral", {"sliding_window": 0}),
        ("mistral", {"sliding_window": -1}),
        ("qwen2", {"sliding_window": 0, "use_sliding_window": True, "max_window_layers": 0}),
    ],
    ids=["mistral-zero", "mistral-negative", "qwen2-zero"],
)
def test_a_sliding_window_below_one_where_it_applies_is_refused_naming_it(tmp_path, family, fields):
    """A sliding_window the family applies (Mistral's every layer, Qwen's with use_sliding_window)
    is null or an int >= 1. 0 or below loaded and ran as full attention, where transformers' own
    forward fails on the mask's shape: a model other than the one config.json states. Where the
    family ignores the key (Qwen2 without use_sliding_window, Llama) any value still loads."""
    path = make_checkpoint(family, tmp_path / "ckpt")
    _set_config(path, **fields)
    window = fields["sliding_window"]
    with pytest.raises(
        CheckpointError, match=rf"config\.json: sliding_window must be an int >= 1 .*, got {window}"
    ):
        build_model(path)
    if family == "qwen2":
        _set_config(path, use_sliding_window=False)
        build_model(path)
    _set_config(path, sliding_window=None)
    build_model(path)
    _set_config(path, sliding_window=1)  # the least window: each token attends to itself
    build_model(path)


def test_llama_ignores_a_stray_sliding_window_whatever_use_sliding_window_says(tmp_path):
    """Llama's attention applies no window (the key is Mistral's, and Qwen's under
    use_sliding_window): a config.json that carries both keys anyway, with a window no family
    could apply, loads; only the families that apply a window have it checked."""
    path = make_checkpoint("llama", tmp_path / "ckpt")
    _set_config(path, sliding_window=0, use_sliding_window=True)
    build_model(path)


def _remote_code(path: Path, reference: str) -> None:
    """config.json's auto_map names `reference` (a module of the directory, or another repo's:
    "owner/repo--module.Class") for AutoConfig, and the directory holds a module that raises
    when run."""
    _set_config(path, auto_map={"AutoConfig": reference})
    (path / "configuration_mine.py").write_text("raise RuntimeError('the checkpoint ran its own code')\n")


def test_load_config_runs_no_code_of_the_checkpoint_unless_asked(tmp_path):
    """A checkpoint whose config.json maps AutoConfig to a module of its own: load_config, the
    public function every loader path calls, runs none of it by default (the supported
    families are transformers' own classes), and runs it only with trust_remote_code=True."""
    path = make_checkpoint("llama", tmp_path / "ckpt")
    _remote_code(path, "configuration_mine.MineConfig")
    assert load_config(path).model_type == "llama"
    with pytest.raises(CheckpointError, match="the checkpoint ran its own code"):
        load_config(path, trust_remote_code=True)


def test_load_config_never_asks_the_hub_even_for_another_repos_code(tmp_path, monkeypatch):
    """ "Never touches the hub": under trust_remote_code=True an auto_map naming another repo's
    module ("owner/repo--module.Class") is looked for in the local cache only (local_files_only),
    and refused as a CheckpointError when it is not there, never downloaded."""
    import transformers.utils.hub

    asked = []

    def hub_download(*args, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        raise OSError("not in the cache")

    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", hub_download)
    path = make_checkpoint("llama", tmp_path / "ckpt")
    _remote_code(path, "someone/repo--configuration_mine.MineConfig")
    with pytest.raises(CheckpointError, match="cannot build the config"):
        load_config(path, trust_remote_code=True)
    assert asked and all(asked), asked
