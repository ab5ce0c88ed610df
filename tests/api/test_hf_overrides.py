"""vLLM's hf_overrides (EngineArgs, LLM(), `--hf-overrides JSON`): a dict of config.json keys laid
over the target checkpoint's before anything reads it (worker/loader.py read_config_json). The
strongest check: an engine over the checkpoint with the override gives what an engine over a copy
whose config.json was saved with that value gives, and not what the checkpoint alone gives. A
nested dict merges key by key (rope_parameters keeps its rope_type / rope_theta); vLLM's older
top-level rope_theta / rope_scaling merge into transformers 5's rope_parameters; a value the
loader refuses is its CheckpointError naming the key; a bad type, and vLLM's callable form, a
ValueError naming hf_overrides."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from enginespec.engine.spec_decode.draft_model import check_draft_checkpoint
from enginespec.engine_args import EngineArgs, resolve_dtype
from enginespec.entrypoints import cli
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint
from enginespec.worker.loader import CheckpointError

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=300, block_size=4)
PROMPT = [5, 9, 14, 20, 33, 41, 7, 12]
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, prompt_logprobs=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """family -> a tiny checkpoint (qwen3: default rope; llama: llama3 rope_parameters;
    mistral: a sliding window of 8, which PROMPT and its outputs cross)."""
    root = tmp_path_factory.mktemp("hfo")
    return {family: make_checkpoint(family, root / family) for family in ("qwen3", "llama", "mistral")}


def _saved_with(src, dest, edit) -> str:
    """A copy of checkpoint `src` (the same weight files) whose config.json `edit` changed."""
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    edit(config)
    (dest / "config.json").write_text(json.dumps(config))
    return str(dest)


def _run(path, **kwargs) -> tuple[list[int], list[float]]:
    """Greedy tokens and the prompt's logprobs of one engine."""
    with LLM(str(path), **ENGINE, **kwargs) as llm:
        (out,) = llm.generate([{"prompt_token_ids": PROMPT}], PARAMS, use_tqdm=False)
    prompt_lps = [lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], PROMPT[1:])]
    return list(out.outputs[0].token_ids), prompt_lps


def _assert_same_model(got, want) -> None:
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], abs=1e-5)


def test_max_position_embeddings_override_sets_the_derived_max_model_len(ckpt):
    with LLM(str(ckpt["qwen3"]), **ENGINE) as llm:
        assert llm.engine.max_model_len == 256  # the checkpoint's own
    with LLM(str(ckpt["qwen3"]), hf_overrides={"max_position_embeddings": 128}, **ENGINE) as llm:
        assert llm.engine.max_model_len == 128
        assert llm.engine.model.config.max_position_embeddings == 128


def _rope_theta_50(config):
    config["rope_parameters"]["rope_theta"] = 50.0


@pytest.mark.parametrize(
    "overrides, edit",
    [
        ({"rms_norm_eps": 0.5}, lambda c: c.update(rms_norm_eps=0.5)),
        ({"rope_parameters": {"rope_theta": 50.0}}, _rope_theta_50),  # nested: rope_type kept
        ({"rope_theta": 50.0}, _rope_theta_50),  # vLLM users' top-level name, folded in
    ],
    ids=["rms_norm_eps", "rope_parameters.rope_theta", "rope_theta"],
)
def test_an_override_is_the_checkpoint_saved_with_that_value(ckpt, tmp_path, overrides, edit):
    given = copy.deepcopy(overrides)
    plain = _run(ckpt["qwen3"])
    overridden = _run(ckpt["qwen3"], hf_overrides=overrides)
    saved = _run(_saved_with(ckpt["qwen3"], tmp_path / "saved", edit))
    _assert_same_model(overridden, saved)
    assert overridden[1] != pytest.approx(plain[1], abs=1e-3)  # the override changed the model
    assert overrides == given  # the caller's dict is not merged into


def test_a_nested_rope_override_merges_into_the_checkpoints_rope(ckpt, tmp_path):
    """llama's rope_parameters (llama3: factor 8, rope_theta, frequency factors): an override of
    its factor alone keeps the rest, as a config.json saved with that factor does."""

    def factor_2(config):
        config["rope_parameters"]["factor"] = 2.0

    overridden = _run(ckpt["llama"], hf_overrides={"rope_parameters": {"factor": 2.0}})
    _assert_same_model(overridden, _run(_saved_with(ckpt["llama"], tmp_path / "saved", factor_2)))
    assert overridden[1] != pytest.approx(_run(ckpt["llama"])[1], abs=1e-3)


def test_a_rope_scaling_override_stretches_max_model_len_and_keeps_rope_theta(ckpt, tmp_path):
    """vLLM's yarn recipe, {"rope_scaling": {...}} over a checkpoint whose config.json has
    transformers 5's rope_parameters: max_model_len is factor x original positions, and the
    checkpoint's rope_theta stays (transformers alone would reset it to the family default)."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}

    def saved_yarn(config):
        config["rope_parameters"] = {"rope_theta": 5000.0, **yarn}

    def theta_5000(config):
        config["rope_parameters"]["rope_theta"] = 5000.0

    base = _saved_with(ckpt["qwen3"], tmp_path / "theta", theta_5000)
    with LLM(base, hf_overrides={"rope_scaling": yarn}, **ENGINE) as llm:
        assert llm.engine.max_model_len == 1024
        assert llm.engine.model.config.rope_parameters == {"rope_theta": 5000.0, **yarn}
    want = _run(_saved_with(base, tmp_path / "yarn", saved_yarn))
    _assert_same_model(_run(base, hf_overrides={"rope_scaling": yarn}), want)
    # both older keys at once, over the checkpoint's own theta: the caller's dicts stay as given
    both = {"rope_theta": 5000.0, "rope_scaling": dict(yarn)}
    _assert_same_model(_run(ckpt["qwen3"], hf_overrides=both), want)
    assert both == {"rope_theta": 5000.0, "rope_scaling": yarn}


def _older_form(config):
    """config.json as transformers 4 saved it: a top-level rope_theta, no rope_parameters."""
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        ({"rope_theta": 50.0}, "rope_theta", 50.0),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}},
            "rope_scaling",
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
        ),
    ],
    ids=["rope_theta", "rope_scaling"],
)
def test_an_override_of_an_older_form_checkpoint_is_that_checkpoint_saved_with_it(
    ckpt, tmp_path, overrides, key, value
):
    """A checkpoint saved in the older form (rope_theta at the top, no rope_parameters), as
    many on the hub are: vLLM's rope_theta / rope_scaling overrides are its own keys there and
    are laid over as given (there is no rope_parameters to fold them into). The caller's dict
    is left as given, though transformers fills the rope dict it builds from (rope_theta)."""
    given = copy.deepcopy(overrides)
    older = _saved_with(ckpt["qwen3"], tmp_path / "older", _older_form)

    def saved(config):
        _older_form(config)
        config[key] = copy.deepcopy(value)

    overridden = _run(older, hf_overrides=overrides)
    _assert_same_model(overridden, _run(_saved_with(ckpt["qwen3"], tmp_path / "saved", saved)))
    assert overridden[1] != pytest.approx(_run(older)[1], abs=1e-3)
    assert overrides == given


def test_rope_parameters_given_beside_rope_theta_win_as_in_a_saved_config(ckpt, tmp_path):
    """Both forms in one override: config.json saved with both gives transformers'
    rope_parameters (the top-level rope_theta is ignored), and so does the override; the
    top-level rope_theta is folded in only where rope_parameters is not given."""
    overrides = {"rope_parameters": {"rope_theta": 50.0}, "rope_theta": 7.0}

    def both(config):
        config["rope_parameters"]["rope_theta"] = 50.0
        config["rope_theta"] = 7.0

    overridden = _run(ckpt["qwen3"], hf_overrides=overrides)
    _assert_same_model(overridden, _run(_saved_with(ckpt["qwen3"], tmp_path / "both", both)))
    _assert_same_model(overridden, _run(_saved_with(ckpt["qwen3"], tmp_path / "theta", _rope_theta_50)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"max_position_embeddings": 1}, r"max_position_embeddings must be an int >= 2"),
        ({"rope_theta": 0}, r"rope_theta must be a number > 0"),
        ({"architectures": ["GPT2LMHeadModel"]}, r"unsupported architecture \['GPT2LMHeadModel'\]"),
        # not an object: laid over as given (never dropped), so transformers refuses it
        ({"rope_scaling": "yarn"}, r"cannot build the config: .*rope_parameters.*'yarn'"),
    ],
)
def test_an_override_the_loader_refuses_is_its_checkpoint_error(ckpt, overrides, message):
    with pytest.raises(CheckpointError, match=message) as info:
        LLM(str(ckpt["qwen3"]), hf_overrides=overrides, **ENGINE)
    assert f"config.json with hf_overrides {overrides!r}" in str(info.value)


@pytest.mark.parametrize(
    "value, message",
    [
        ([("rope_theta", 1.0)], r"hf_overrides must be None or a dict of config.json keys"),
        ('{"rope_theta": 1}', r"hf_overrides must be None or a dict of config.json keys"),
        ({1: 2}, r"hf_overrides keys must be strings \(config.json's\), got 1"),
        ({"rope_scaling": {2: "x"}}, r"hf_overrides keys must be strings \(config.json's\), got 2"),
        (lambda config: config, r"hf_overrides as a function .*vLLM's callable form.* does not cross"),
    ],
)
def test_a_bad_hf_overrides_is_a_value_error_naming_it(value, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model="/m", hf_overrides=value)


def test_the_clis_hf_overrides_reaches_the_engine(ckpt, tmp_path, capsys):
    """`enginespec generate --hf-overrides JSON` (serve builds its EngineArgs from the same
    flags) and vLLM's dotted form generate what the checkpoint saved with the value does."""
    base = ["generate", "--model", str(ckpt["qwen3"]), "--prompt", "abcab", "--max-tokens", "12"]
    base += ["--device", "cpu", "--dtype", "float32", "--ignore-eos"]

    def generate(argv) -> str:
        assert cli.main(argv) == 0
        return capsys.readouterr().out

    saved = _saved_with(ckpt["qwen3"], tmp_path / "saved", lambda c: c.update(rms_norm_eps=0.5))
    want = generate([*base[:2], saved, *base[3:]])
    assert generate([*base, "--hf-overrides", '{"rms_norm_eps": 0.5}']) == want
    assert generate([*base, "--hf-overrides.rms_norm_eps", "0.5"]) == want
    assert generate(base) != want


def test_a_dtype_override_is_what_auto_resolves_on_cuda(ckpt):
    """dtype "auto" on CUDA takes config.json's dtype (bfloat16 for a float32 one): an override
    of dtype, or of vLLM users' torch_dtype beside the file's dtype, is the one read. (The device
    is only named here: resolve_dtype reads no GPU.)"""
    cuda = torch.device("cuda")
    assert resolve_dtype("auto", str(ckpt["qwen3"]), cuda) == torch.bfloat16  # saved float32
    for key in ("dtype", "torch_dtype"):
        assert resolve_dtype("auto", str(ckpt["qwen3"]), cuda, {key: "float16"}) == torch.float16
    # both names in one override: transformers 5 reads dtype (torch_dtype is its older alias)
    both = {"torch_dtype": "bfloat16", "dtype": "float16"}
    assert resolve_dtype("auto", str(ckpt["qwen3"]), cuda, both) == torch.float16


def test_overrides_apply_to_the_target_not_the_draft(ckpt, tmp_path):
    """As vLLM's: the draft model's config is its own config.json. The early draft check reads
    the target's config with the overrides (a vocabulary the override changed is compared)."""
    draft = make_checkpoint("qwen3", tmp_path / "draft", seed=1)
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    overrides = {"max_position_embeddings": 128}
    with LLM(str(ckpt["qwen3"]), speculative_config=spec, hf_overrides=overrides, **ENGINE) as llm:
        assert llm.engine.max_model_len == 128
        assert llm.engine.draft_model.max_position_embeddings == 256
    check_draft_checkpoint(str(draft), str(ckpt["qwen3"]), False, overrides)
    with pytest.raises(ValueError, match=r"the draft.s vocab_size \(96\) must equal the target.s \(95\)"):
        check_draft_checkpoint(str(draft), str(ckpt["qwen3"]), False, {"vocab_size": 95})


def test_an_override_that_mends_the_targets_vocab_size_lets_its_draft_run(ckpt, tmp_path):
    """A target whose config.json misstates vocab_size (95; its weights have 96 rows) runs with
    {"vocab_size": 96}, and so does a draft of 96 tokens: the early draft check compares the
    draft with the target as overridden, not as its file says."""
    draft = make_checkpoint("qwen3", tmp_path / "draft", seed=1)
    target = _saved_with(ckpt["qwen3"], tmp_path / "target", lambda c: c.update(vocab_size=95))
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    with LLM(target, speculative_config=spec, hf_overrides={"vocab_size": 96}, **ENGINE) as llm:
        (out,) = llm.generate([{"prompt_token_ids": PROMPT}], PARAMS, use_tqdm=False)
    assert list(out.outputs[0].token_ids) == _run(ckpt["qwen3"])[0]


def test_an_eos_token_id_override_ends_generation_there(ckpt):
    """config.json's eos_token_id is one of the ids that end a request (engine _eos_ids: a
    further EOS beside the tokenizer's): an override of it ends greedy generation at that id."""
    params = SamplingParams(max_tokens=8, temperature=0)
    prompt = [{"prompt_token_ids": PROMPT}]
    with LLM(str(ckpt["qwen3"]), **ENGINE) as llm:
        (plain,) = llm.generate(prompt, params, use_tqdm=False)
    tokens = list(plain.outputs[0].token_ids)
    assert len(tokens) == 8 and plain.outputs[0].finish_reason == "length"
    cut = next(i for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])  # its first time
    with LLM(str(ckpt["qwen3"]), hf_overrides={"eos_token_id": tokens[cut]}, **ENGINE) as llm:
        (out,) = llm.generate(prompt, params, use_tqdm=False)
    assert list(out.outputs[0].token_ids) == tokens[: cut + 1]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", tokens[cut])


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}


@pytest.mark.parametrize(
    "family, overrides, built",
    [
        ("mistral", LLAMA, "LlamaForCausalLM"),  # full attention: the window goes
        ("mistral", {"architectures": ["LlamaForCausalLM"]}, "LlamaForCausalLM"),  # vLLM's way
        ("llama", {"model_type": "mistral", "sliding_window": 4}, "MistralForCausalLM"),
    ],
    ids=["architectures+model_type", "architectures", "model_type"],
)
def test_an_override_of_the_family_builds_that_familys_model(ckpt, tmp_path, family, overrides, built):
    """The class built is the one the overridden config names: an override of architectures
    (vLLM picks its model class by them) or of model_type (transformers' AutoConfig picks the
    config class by it) builds that family, as the checkpoint saved with that family's
    architectures and model_type does. The config class was picked from config.json alone: the
    override was dropped without a word (a Mistral ran with its window; a Llama's config read
    model_type 'mistral' while its modules were Llama's)."""
    import transformers

    saved_as = {k: v for k, v in overrides.items() if k not in ("architectures", "model_type")}
    saved_as.update(architectures=[built], model_type=getattr(transformers, built).config_class.model_type)
    with LLM(str(ckpt[family]), hf_overrides=overrides, **ENGINE) as llm:
        config = llm.engine.model.config
        assert type(config) is getattr(transformers, built).config_class
        assert config.model_type == saved_as["model_type"]
    overridden = _run(ckpt[family], hf_overrides=overrides)
    _assert_same_model(
        overridden, _run(_saved_with(ckpt[family], tmp_path / "saved", lambda c: c.update(saved_as)))
    )
    assert overridden[0] != _run(ckpt[family])[0]  # the override changed the model (its window)


def test_an_override_naming_two_families_is_a_checkpoint_error(ckpt):
    overrides = {"architectures": ["LlamaForCausalLM"], "model_type": "mistral"}
    message = r"architectures \['LlamaForCausalLM'\] .*model_type 'llama'.* got model_type 'mistral'"
    with pytest.raises(CheckpointError, match=message):
        LLM(str(ckpt["qwen3"]), hf_overrides=overrides, **ENGINE)


def _older_form(config):
    """config.json as transformers 4 saved it: rope_theta and rope_scaling at the top level."""
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params


@pytest.mark.parametrize("form", ["rope_parameters", "older"])
@pytest.mark.parametrize("name", ["rope_scaling", "rope_parameters"])
def test_a_null_rope_override_is_the_default_rope_at_the_checkpoints_theta(ckpt, tmp_path, form, name):
    """{"rope_scaling": null} (vLLM users' way to turn a checkpoint's rope scaling off) or
    {"rope_parameters": null}: the default rope at the checkpoint's rope_theta, whichever form
    config.json has, as a config.json saved with the default rope gives. Over transformers 5's
    rope_parameters, a null rope_scaling was ignored (llama3 scaling kept), and a null
    rope_parameters over the older form kept the scaling too."""
    base = str(ckpt["llama"])
    if form == "older":
        base = _saved_with(ckpt["llama"], tmp_path / "older", _older_form)

    def theta_500_default(config):
        config.pop("rope_scaling", None)
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0}

    theta_500 = _saved_with(
        ckpt["llama"], tmp_path / "theta", lambda c: c["rope_parameters"].update(rope_theta=500.0)
    )
    if form == "older":
        theta_500 = _saved_with(theta_500, tmp_path / "theta_older", _older_form)
    with LLM(theta_500, hf_overrides={name: None}, **ENGINE) as llm:
        assert llm.engine.model.config.rope_parameters == {"rope_type": "default", "rope_theta": 500.0}
    overridden = _run(theta_500, hf_overrides={name: None})
    _assert_same_model(overridden, _run(_saved_with(ckpt["llama"], tmp_path / "saved", theta_500_default)))
    assert overridden[1] != pytest.approx(_run(theta_500)[1], abs=1e-3)  # the scaling is gone
    with LLM(base, hf_overrides={name: None, "rope_theta": 50.0}, **ENGINE) as llm:  # theta given too
        assert llm.engine.model.config.rope_parameters == {"rope_type": "default", "rope_theta": 50.0}
