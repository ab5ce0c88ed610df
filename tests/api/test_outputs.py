"""enginespec.outputs: Logprob, vLLM's Logprob attributes on a float that still acts as one;
CompletionOutput's finished(), a method as vLLM's."""

from __future__ import annotations

import copy
import json
import math
import pickle

from enginespec.outputs import CompletionOutput, Logprob, OutputView, RequestOutput
from enginespec.spec import RequestOutputKind


def test_logprob_is_the_float_with_vllms_attributes():
    lp = Logprob(-0.25, rank=3, decoded_token=" the")
    assert (lp.logprob, lp.rank, lp.decoded_token) == (-0.25, 3, " the")
    assert type(lp.logprob) is float
    assert lp == -0.25 and hash(lp) == hash(-0.25) and {1: lp} == {1: -0.25}
    assert lp + 1 == 0.75 and -lp == 0.25 and lp < 0 and math.isclose(lp, -0.25)
    assert sorted([Logprob(-2.0, 2), lp]) == [-2.0, -0.25]
    assert Logprob(logprob=-1.0).rank is None and Logprob(-1.0).decoded_token is None


def test_logprob_prints_reads_and_travels_as_its_float():
    """str and f-strings print the number (as the plain float did), repr is vLLM's; JSON
    writes the number; pickle and deepcopy keep rank and decoded_token (engine-core deltas)."""
    lp = Logprob(-0.5, rank=1, decoded_token="a")
    assert str(lp) == f"{lp}" == "-0.5" and f"{lp:.2f}" == "-0.50"
    assert repr(lp) == "Logprob(logprob=-0.5, rank=1, decoded_token='a')"
    assert json.dumps({"lp": lp}) == '{"lp": -0.5}'
    for back in (pickle.loads(pickle.dumps(lp)), copy.deepcopy(lp)):
        assert type(back) is Logprob and (back, back.rank, back.decoded_token) == (-0.5, 1, "a")


def test_completion_output_finished_is_a_method_as_vllms():
    """vLLM's CompletionOutput.finished is a method: code written for vLLM calls
    `c.finished()`, which a property's bool cannot answer (TypeError), and a bound method is
    always truthy, so the value must come from the call."""
    running, done = CompletionOutput(0, "a", [5]), CompletionOutput(1, "b", [6], finish_reason="stop")
    assert running.finished() is False and done.finished() is True


def test_a_delta_view_sends_a_running_sample_again_and_a_finished_one_never():
    """OutputView reads finished() (not the method object, which is always truthy): a running
    sample's next tokens still come as deltas, a finished one is sent once."""
    view = OutputView(RequestOutputKind.DELTA)
    sample = CompletionOutput(0, "a", [5])
    out = RequestOutput("r", None, [1], [sample])
    assert [c.token_ids for c in view.view(out).outputs] == [[5]]
    sample.token_ids.append(6)
    sample.text += "b"
    assert [c.token_ids for c in view.view(out).outputs] == [[6]]
    sample.finish_reason = "length"
    out.finished = True
    assert [c.finish_reason for c in view.view(out).outputs] == ["length"]
    assert view.view(out).outputs == []


def test_vllms_attributes_of_features_we_lack_read_none_and_stay_out_of_pickles():
    sample = CompletionOutput(index=0, token_ids=[1], finish_reason="length")
    out = RequestOutput("r", "p", [1, 2], [sample], finished=True, num_cached_tokens=0)
    for name in (
        "lora_request",
        "encoder_prompt",
        "encoder_prompt_token_ids",
        "metrics",
        "kv_transfer_params",
    ):
        assert getattr(out, name) is None, name
    assert sample.lora_request is None
    assert "metrics" not in vars(out) and "lora_request" not in vars(sample)
    assert pickle.loads(pickle.dumps(out)) == out
