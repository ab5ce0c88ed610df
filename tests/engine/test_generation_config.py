"""generation_config.json: its further EOS ids stop requests, its sampling defaults apply only
where the user did not choose (engine/generation_config.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest

from enginespec.engine.generation_config import GenerationDefaults, further_eos_ids
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _dir_with(tmp_path, content) -> str:
    (tmp_path / "generation_config.json").write_text(
        content if isinstance(content, str) else json.dumps(content)
    )
    return str(tmp_path)


def test_sampling_defaults_are_the_file_diff_against_transformers_defaults(tmp_path):
    path = _dir_with(
        tmp_path,
        {
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "max_new_tokens": 7,
            "do_sample": True,
            "eos_token_id": [5, 9],
        },
    )
    got = GenerationDefaults.from_dir(path)
    # min_p 0.0 differs from transformers' None and is applied (it equals ours); 1.0 is the default
    assert got.sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_tokens": 7}
    assert got.eos_token_ids == (5, 9)
    params = got.params()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.95, 20, 7)
    assert got.params(SamplingParams(seed=3)).seed == 3


def test_transformers_defaults_stated_in_the_file_change_nothing(tmp_path):
    got = GenerationDefaults.from_dir(_dir_with(tmp_path, {"temperature": 1.0, "top_k": 50, "top_p": 1.0}))
    assert got.sampling == {} and got.params() == SamplingParams()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", json.dumps({"eos_token_id": "x"})])
def test_an_unreadable_file_means_no_defaults(tmp_path, content):
    got = GenerationDefaults.from_dir(_dir_with(tmp_path, content))
    assert got == GenerationDefaults()


def test_no_file_or_no_path_means_no_defaults(tmp_path):
    assert GenerationDefaults.from_dir(str(tmp_path)) == GenerationDefaults()
    assert GenerationDefaults.from_dir(None) == GenerationDefaults()


def test_a_value_the_spec_refuses_is_dropped_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="enginespec.engine.generation_config"):
        got = GenerationDefaults.from_dir(_dir_with(tmp_path, {"temperature": -1.0, "top_p": 0.5}))
    assert got.sampling == {"top_p": 0.5}
    assert "temperature" in caplog.text


def test_further_eos_ids_skip_the_model_eos_and_repeats():
    assert further_eos_ids(3, [3, 7], 7, (8, 3), None) == (7, 8)
    assert further_eos_ids(None, 4) == (4,)


def test_eos_ids_that_are_not_ints_are_left_out(tmp_path):
    """A JSON true is a Python int: an `eos_token_id: true`, or a list holding bools, floats,
    strings or nulls, gives only its real ints (a bool never becomes id 1 or 0, and a stray
    string or null never crashes the load: the missing-or-odd-file invariant)."""
    odd = [2, True, 3.5, "7", None, 4]
    assert GenerationDefaults.from_dir(_dir_with(tmp_path, {"eos_token_id": True})).eos_token_ids == ()
    assert GenerationDefaults.from_dir(_dir_with(tmp_path, {"eos_token_id": odd})).eos_token_ids == (2, 4)
    assert further_eos_ids(None, False, [True, 5]) == (5,)


def _checkpoint_with(tmp_path, **fields) -> str:
    """A copy of the tiny qwen3 checkpoint whose generation_config.json gains `fields`."""
    dest = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir("qwen3"), dest)
    file = dest / "generation_config.json"
    raw = json.loads(file.read_text()) if file.is_file() else {}
    file.write_text(json.dumps({**raw, **fields}))
    return str(dest)


def _llm(path, impl):
    from enginespec.llm import LLM

    return LLM(path, impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=64)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_a_further_eos_id_of_the_file_stops_greedy_output_unless_ignore_eos(tmp_path, impl):
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    plain = _llm(str(tiny_model_dir("qwen3")), impl).generate("abc", greedy, use_tqdm=False)[0].outputs[0]
    ids = plain.token_ids
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # first repeat-free id after 0
    llm = _llm(_checkpoint_with(tmp_path, eos_token_id=[llm_eos(), ids[cut]]), impl)
    out = llm.generate("abc", greedy, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[: cut + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", ids[cut])
    free = llm.generate(
        "abc", SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    assert free[0].outputs[0].token_ids[: cut + 1] == ids[: cut + 1]
    assert len(free[0].outputs[0].token_ids) == 10


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_the_tokenizers_own_eos_id_stops_greedy_output_unless_ignore_eos(tmp_path, impl):
    """A tokenizer whose eos_token is neither config.json's nor generation_config.json's (a
    fine-tune's chat EOS; Llama 3 Instruct's <|eot_id|> beside config.json's <|end_of_text|>
    first) stops requests, as vLLM's requests carry the tokenizer's EOS id; it ran on to
    max_tokens before. It is the request's EOS, so its stop_reason is None as vLLM's (a stop
    token's id is reported only for stop_token_ids and the further EOS ids); it was its id."""
    from enginespec.testing.checkpoints import SPECIAL_TOKENS

    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    plain = _llm(str(tiny_model_dir("qwen3")), impl).generate("abc", greedy, use_tqdm=False)[0].outputs[0]
    ids = plain.token_ids
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # first repeat-free id after 0
    assert ids[cut] >= len(SPECIAL_TOKENS), "the tokenizer's char ids start after its special tokens"
    dest = _checkpoint_with(tmp_path)
    config_file = tmp_path / "ckpt" / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token"] = chr(33 + ids[cut] - len(SPECIAL_TOKENS))  # the char tokenizer's id ids[cut]
    config_file.write_text(json.dumps(config))
    llm = _llm(dest, impl)
    assert llm.get_tokenizer().eos_token_id == ids[cut] != llm_eos()
    out = llm.generate("abc", greedy, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[: cut + 1] and out.finish_reason == "stop"
    assert out.stop_reason is None
    free = llm.generate(
        "abc", SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    assert free[0].outputs[0].token_ids == ids


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("source", ["generation_config.json", "config.json"])
def test_min_tokens_bans_every_further_eos_id_under_ignore_eos_too(tmp_path, impl, source):
    """ignore_eos ignores every EOS id, the checkpoint's further ones (generation_config.json's
    list, config.json's list) as well as the request's; and min_tokens bans them all until that
    many tokens are out, under ignore_eos too, as vLLM's min_tokens masks all_stop_token_ids
    (which hold the file's EOS ids whatever ignore_eos says). A further EOS id was drawn below
    min_tokens under ignore_eos: it was a stop id only without ignore_eos."""
    free = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ids = (
        _llm(str(tiny_model_dir("qwen3")), impl).generate("abc", free, use_tqdm=False)[0].outputs[0].token_ids
    )
    further = ids[0]  # greedy's first id: what min_tokens must steer away from
    if source == "config.json":
        dest = _checkpoint_with(tmp_path)
        config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
        config["eos_token_id"] = [llm_eos(), further]
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    else:
        dest = _checkpoint_with(tmp_path, eos_token_id=[llm_eos(), further])
    llm = _llm(dest, impl)
    assert llm.generate("abc", free, use_tqdm=False)[0].outputs[0].token_ids == ids  # ignored
    held = dataclasses.replace(free, min_tokens=3)
    out = llm.generate("abc", held, use_tqdm=False)[0].outputs[0]
    assert further not in out.token_ids[:3] and llm_eos() not in out.token_ids[:3]
    assert (len(out.token_ids), out.finish_reason) == (10, "length")


def llm_eos() -> int:
    """The tiny checkpoint's own eos_token_id (config.json)."""
    return json.loads((tiny_model_dir("qwen3") / "config.json").read_text())["eos_token_id"]


def test_generate_without_params_uses_the_file_defaults_and_given_params_are_kept(tmp_path):
    llm = _llm(_checkpoint_with(tmp_path, temperature=0.0, max_new_tokens=5), "fast")
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.0, 5)
    implicit = llm.generate("abc", use_tqdm=False)[0].outputs[0]
    explicit = llm.generate("abc", SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)[0].outputs[
        0
    ]
    assert implicit.token_ids == explicit.token_ids and len(implicit.token_ids) <= 5
    given = llm.generate(
        "abc", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    assert len(given[0].outputs[0].token_ids) == 8  # a user's params are not overridden


def test_vllm_generation_config_keeps_the_eos_ids_and_drops_the_sampling_defaults(tmp_path):
    """vLLM's generation_config="vllm": its neutral sampling defaults, the file's EOS ids still."""
    path = _dir_with(tmp_path, {"temperature": 0.6, "max_new_tokens": 7, "eos_token_id": [5, 9]})
    got = GenerationDefaults.load(path, "vllm")
    assert got.sampling == {} and got.eos_token_ids == (5, 9)
    assert GenerationDefaults.load(path, "auto") == GenerationDefaults.from_dir(path)


def test_a_generation_config_directory_is_read_instead_of_the_models(tmp_path):
    model, other = tmp_path / "model", tmp_path / "other"
    model.mkdir(), other.mkdir()
    _dir_with(model, {"temperature": 0.6, "eos_token_id": 5})
    _dir_with(other, {"top_p": 0.5, "eos_token_id": 7})
    got = GenerationDefaults.load(str(model), str(other))
    assert got.sampling == {"top_p": 0.5} and got.eos_token_ids == (7,)
    with pytest.raises(ValueError, match="generation_config"):
        GenerationDefaults.load(str(model), str(tmp_path / "missing"))


def test_override_generation_config_sets_defaults_over_any_source(tmp_path, caplog):
    path = _dir_with(tmp_path, {"temperature": 0.6, "top_p": 0.9})
    override = {"temperature": 0.2, "top_k": 50, "max_new_tokens": 4, "do_sample": True}
    with caplog.at_level(logging.WARNING, logger="enginespec.engine.generation_config"):
        got = GenerationDefaults.load(path, "auto", override)
    # as given, transformers' default top_k 50 included; do_sample is no sampling key
    assert got.sampling == {"temperature": 0.2, "top_p": 0.9, "top_k": 50, "max_tokens": 4}
    assert "do_sample" in caplog.text
    assert GenerationDefaults.load(path, "vllm", {"top_p": 0.5}).sampling == {"top_p": 0.5}
    with pytest.raises(ValueError, match=r"override_generation_config\['temperature'\]"):
        GenerationDefaults.load(path, "auto", {"temperature": -1.0})


def test_llm_takes_vllms_generation_config_arguments(tmp_path):
    """A ported LLM(..., generation_config="vllm", override_generation_config={...}) was a
    TypeError (unknown engine arguments)."""
    from enginespec.engine_args import EngineArgs
    from enginespec.llm import LLM

    path = _checkpoint_with(tmp_path, temperature=0.0, max_new_tokens=5)
    small = dict(impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=64)
    neutral = LLM(path, generation_config="vllm", **small)
    assert neutral.get_default_sampling_params() == SamplingParams()
    overridden = LLM(path, override_generation_config={"max_new_tokens": 3}, **small)
    defaults = overridden.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.0, 3)
    assert len(overridden.generate("abc", use_tqdm=False)[0].outputs[0].token_ids) <= 3
    with pytest.raises(ValueError, match="generation_config"):
        EngineArgs(generation_config=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="override_generation_config"):
        EngineArgs(override_generation_config=[("temperature", 0.5)])
