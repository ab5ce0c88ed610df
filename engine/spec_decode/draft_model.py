"""DraftModelDrafter (vLLM's `draft_model` method): a smaller checkpoint of the same vocabulary,
run by the engine's own machinery (FlatModel, ModelRunner), proposes k tokens greedily.

Its KV lives in its own pool, managed by a BlockManager of the engine's impl (caching off), so
it follows the spec's rules: `allocate_slots` before a forward, `trim` for rejected drafts,
`free` when the request goes. Each drafted request has a mirror request in that pool:

- `mirror.token_ids` are the target's real tokens the drafter has seen (append-only, as the
  target's), `mirror.spec_token_ids` the drafts it fed back into its own forwards, and
  `mirror.num_computed_tokens` the positions whose draft K/V is written. Invariant between
  proposals: num_computed_tokens <= num_tokens + len(spec_token_ids), and the K/V of every
  computed position was computed from the tokens (then drafts) at those positions.
- Catching up (`_sync`): the target accepted a prefix of the drafts and appended one token.
  The mirror keeps the computed positions whose token the target agrees with, at most
  num_real - 1 (the newest token's logits are needed), trims its table to them, then appends
  the target's new tokens. A new (or preempted and resumed) request starts from position 0:
  its whole prompt is the catch-up, run in chunks of max_num_batched_tokens.
- Proposing: one forward over every request's catch-up tokens (their last row gives draft 0),
  then k - 1 forwards of one token per request, each feeding the previous draft back. So a
  step costs k draft forwards; all but the first have one token per request (CUDA-graph
  buckets on the GPU).

Drafts are the draft model's argmax of the raw logits (penalties and other logits edits are
not applied: they only lower acceptance). Greedy drafts keep verify.py exact for sampled
requests too: its rejection rule treats q as one-hot, which a deterministic drafter is.

Leaving: a request the target no longer runs (finished, aborted, preempted by recompute or
swap) loses its mirror and draft blocks at the next proposal, or at `forget`; the draft KV is
recomputed, never swapped. A request whose draft blocks cannot be allocated gets no drafts.
"""

from __future__ import annotations

from typing import Optional, Sequence

from enginespec.engine.spec_decode.drafter import Drafter
from enginespec.engine_args import ALLOW_LONG_MAX_MODEL_LEN_ENV, allow_long_max_model_len
from enginespec.spec import SamplingParams, SchedulerOutput, Status

_PARAMS = SamplingParams(max_tokens=1)  # mirrors never sample through the sampler


class DraftModelDrafter(Drafter):
    """Greedy proposals from `runner.model` over a pool managed by `block_manager`."""

    def __init__(self, runner, impl, block_manager, num_speculative_tokens: int, max_num_batched_tokens: int):
        self.runner = runner
        self.impl = impl
        self.block_manager = block_manager
        self.k = num_speculative_tokens
        self.max_num_batched_tokens = max_num_batched_tokens
        self._mirrors: dict[str, tuple[object, object]] = {}  # id -> (target request, mirror)
        self._released: list[str] = []  # ids freed since the last forward (the builder drops rows)
        self.num_forwards = 0

    def would_propose(self, request, num_real: int) -> bool:
        """A model always has a proposal."""
        return num_real >= 1

    def forget(self, request_id: str) -> None:
        found = self._mirrors.pop(request_id, None)
        if found is not None:
            self.block_manager.free(found[1])
            self._released.append(request_id)

    def __len__(self) -> int:
        return len(self._mirrors)

    # ---- catching up ---------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Free the mirrors of requests the target no longer runs."""
        for rid in [rid for rid, (t, _) in self._mirrors.items() if t.status is not Status.RUNNING]:
            self.forget(rid)

    def _sync(self, request, num_real: int):
        """The request's mirror, caught up with its first num_real tokens (module doc)."""
        found = self._mirrors.get(request.request_id)
        if found is not None and (found[0] is not request or found[1].num_tokens > num_real):
            self.forget(request.request_id)
            found = None
        if found is None:
            mirror = self.impl.new_request(request.request_id, list(request.token_ids[:num_real]), _PARAMS)
            self._mirrors[request.request_id] = (request, mirror)
            return mirror
        mirror = found[1]
        old = mirror.num_tokens
        new = list(request.token_ids[old:num_real])
        drafts = mirror.spec_token_ids
        agreed = 0
        while agreed < min(len(drafts), len(new)) and drafts[agreed] == new[agreed]:
            agreed += 1
        valid = min(mirror.num_computed_tokens, old + agreed, num_real - 1)
        mirror.spec_token_ids = []
        if valid < mirror.num_computed_tokens:
            mirror.num_computed_tokens = valid
            self.block_manager.trim(mirror, valid)
        for token in new:
            mirror.append(token)
        return mirror

    # ---- proposing -----------------------------------------------------------------------------

    def propose_batch(
        self, requests: Sequence, num_reals: Sequence[int], max_drafts: Sequence[int]
    ) -> list[list[int]]:
        """Up to min(k, max_drafts[i]) greedy drafts per request, from k batched forwards."""
        self._sweep()
        out: list[list[int]] = [[] for _ in requests]
        work = []  # (index, mirror, number of drafts)
        for i, (request, num_real, limit) in enumerate(zip(requests, num_reals, max_drafts)):
            limit = min(self.k, limit)
            if limit < 1 or num_real < 1:
                continue
            mirror = self._sync(request, num_real)
            need = num_real - mirror.num_computed_tokens + limit - 1  # catch-up + fed-back drafts
            if not self.block_manager.allocate_slots(mirror, need):
                self.forget(request.request_id)  # no room: no drafts, and its blocks go back
                continue
            work.append((i, mirror, limit))
        if not work:
            return out
        first = self._catch_up([m for _, m, _ in work])
        for i, mirror, _ in work:
            out[i].append(first[mirror.request_id])
        for j in range(1, max(limit for _, _, limit in work)):
            active = [(i, m) for i, m, limit in work if limit > j]
            for i, mirror in active:
                mirror.spec_token_ids.append(out[i][-1])
            drafted = self._forward([(m, 1) for _, m in active])
            for i, mirror in active:
                out[i].append(drafted[mirror.request_id])
        return out

    def _catch_up(self, mirrors: list) -> dict[str, int]:
        """Compute every mirror's uncomputed tokens (chunks of at most max_num_batched_tokens
        per forward); request id -> the draft after its newest token."""
        found: dict[str, int] = {}
        pending = mirrors
        while pending:
            budget, scheduled = self.max_num_batched_tokens, []
            for mirror in pending:
                if budget < 1:
                    break
                n = min(mirror.num_tokens - mirror.num_computed_tokens, budget)
                scheduled.append((mirror, n))
                budget -= n
            found.update(self._forward(scheduled))
            pending = [m for m in pending if m.num_computed_tokens < m.num_tokens]
        return found

    def _forward(self, scheduled: list) -> dict[str, int]:
        """One draft forward over (mirror, n) pairs; advances their computed counts and returns
        request id -> argmax token for each mirror that reached its end."""
        output = SchedulerOutput(scheduled=scheduled, finished=self._released)
        self._released = []
        batch = self.runner.prepare(output, self.block_manager)
        logits = self.runner.execute(batch).logits
        tokens = logits.argmax(dim=-1).tolist()
        for mirror, n in scheduled:
            mirror.num_computed_tokens += n
        self.num_forwards += 1
        return dict(zip(batch.sample_request_ids, tokens))


def check_draft_model(draft, target) -> None:
    """The draft must share the target's vocabulary."""
    _check_vocab(draft.vocab_size, target.vocab_size)


def _check_vocab(draft: int, target: int) -> None:
    if draft != target:
        raise ValueError(
            f"speculative_config.model: the draft's vocab_size ({draft}) must equal the "
            f"target's ({target}); a draft model needs the same tokenizer and vocabulary"
        )


def check_draft_checkpoint(
    draft_path: str,
    target_path: str,
    trust_remote_code: bool = False,
    target_overrides: Optional[dict] = None,
) -> None:
    """What two config.json files tell of a draft, checked before either model loads: the draft
    directory is a checkpoint the loader takes (its errors keep their type, prefixed with
    speculative_config.model) and its vocabulary is the target's. The same rules the loaded
    models meet later (check_draft_model), only sooner: a mistyped path or a draft of another
    tokenizer is refused in milliseconds, not after the target's weights are read. A target
    whose own config cannot be read is left to the target's load to report. target_overrides
    (EngineArgs.hf_overrides) apply to the target's config alone, as vLLM's: the draft is
    checked, and loaded, as its config.json says."""
    from enginespec.worker.loader import CheckpointError, load_config

    try:
        draft = load_config(draft_path, trust_remote_code=trust_remote_code)
    except CheckpointError as e:
        raise type(e)(f"speculative_config.model: {e}") from e
    try:
        target = load_config(target_path, trust_remote_code=trust_remote_code, hf_overrides=target_overrides)
    except CheckpointError:
        return
    _check_vocab(_vocab_size(draft), _vocab_size(target))


def _vocab_size(config) -> int:
    """The vocab_size a FlatModel of this config reports (its text config's)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def check_draft_reach(draft, max_model_len: int) -> None:
    """The draft must reach the engine's final max_model_len positions (checked once the pool
    has lowered a max_model_len the user did not choose, so the bound named is the one the
    engine would serve with). VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows a shorter draft as it
    allows the target past its own positions: the draft's rope then covers max_model_len."""
    reach = getattr(draft, "max_positions", draft.max_position_embeddings)
    if reach < max_model_len and not allow_long_max_model_len():
        raise ValueError(
            f"speculative_config.model: the draft's max_position_embeddings ({reach}, its rope "
            f"scaling's stretch included) must be >= max_model_len ({max_model_len}); "
            f"max_model_len={reach} serves with this draft ({ALLOW_LONG_MAX_MODEL_LEN_ENV}=1 "
            f"allows a shorter draft)"
        )
    cover = getattr(draft, "cover_positions", None)
    if cover is not None:
        cover(max_model_len)


def draft_pool_blocks(
    num_target_blocks: int, max_num_seqs: int, k: int, block_size: int, max_model_len: int
) -> int:
    """Blocks of the draft pool: the target's (the draft holds at most the target's tokens per
    request) plus room for each request's fed-back drafts: k - 1, and never more than
    max_model_len, since a request's drafts keep it within max_model_len (decoder.py's
    `_limit`). So a num_speculative_tokens far above max_model_len sizes no block that can
    never be used (k - 1 blocks per request made k = 10**9 a multi-terabyte allocation)."""
    fed_back = min(k - 1, max_model_len)
    return num_target_blocks + max_num_seqs * -(-max(fed_back, 1) // block_size)
