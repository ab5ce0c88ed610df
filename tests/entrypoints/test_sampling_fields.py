"""entrypoints/openai/sampling.py: a request body's sampling fields as SamplingParams, and the
400 each bad one becomes (errors.bad_request names the body's field in `param`)."""

from __future__ import annotations

import pytest

from enginespec.entrypoints.openai.errors import bad_request
from enginespec.entrypoints.openai.protocol import CompletionRequest
from enginespec.entrypoints.openai.sampling import to_sampling_params


def _refusal(**fields):
    body = CompletionRequest(prompt="a", **fields)
    with pytest.raises(ValueError) as info:
        to_sampling_params(body, max_tokens=4, logprobs=None)
    return bad_request(info.value)


@pytest.mark.parametrize(
    "logit_bias, words",
    [({"abc": 1.0}, "token ids"), ({"5": 101.0}, "[-100, 100]"), ({"5": float("nan")}, "[-100, 100]")],
)
def test_a_bad_logit_bias_is_a_400_naming_logit_bias(logit_bias, words):
    """A key that is no token id, or a bias outside OpenAI's [-100, 100], was a 400 whose
    error.param was null (its message did not start with the field's SamplingParams name, which
    bad_request reads the param from): every other bad sampling field is named."""
    err = _refusal(logit_bias=logit_bias)
    assert (err.status, err.param) == (400, "logit_bias")
    assert words in err.message


def test_a_good_logit_bias_is_token_ids_to_floats():
    body = CompletionRequest(prompt="a", logit_bias={"5": 100, "7": -100.0})
    assert to_sampling_params(body, max_tokens=4, logprobs=None).logit_bias == {5: 100.0, 7: -100.0}
