"""Speculative decoding: drafters propose tokens, one target forward verifies them.

The scheduler core knows nothing of drafters (spec/SCHEDULING.md, "Draft tokens"): a drafter
fills `Request.spec_token_ids` of running decodes before `schedule()`, the scheduler counts them
against the budget like any token, and the engine verifies them after the forward, cuts the
step back to the accepted tokens and trims the table (`SpecDecoder`).
"""

from enginespec.engine.spec_decode.config import SpeculativeConfig
from enginespec.engine.spec_decode.decoder import SpecDecoder
from enginespec.engine.spec_decode.draft_model import DraftModelDrafter
from enginespec.engine.spec_decode.drafter import Drafter
from enginespec.engine.spec_decode.ngram import NgramDrafter
from enginespec.engine.spec_decode.stats import SpecDecodeStats

__all__ = [
    "DraftModelDrafter",
    "Drafter",
    "NgramDrafter",
    "SpecDecodeStats",
    "SpecDecoder",
    "SpeculativeConfig",
]
