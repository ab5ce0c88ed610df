"""enginespec.outputs.Logprob: vLLM's Logprob attributes on a float that still acts as one."""

from __future__ import annotations

import copy
import json
import math
import pickle

from enginespec.outputs import Logprob


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
