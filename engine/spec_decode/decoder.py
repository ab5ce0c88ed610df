"""SpecDecoder: the engine's side of speculative decoding (spec/SCHEDULING.md, "Draft tokens").

Per step, around an unchanged scheduler:
1. `propose` (before schedule()): drafts from the previous step are dropped (drafts are valid
   for the next step only); each running decode (only its newest token uncomputed, no
   logprobs asked, not a seeded sampled request, whose draws must not depend on the batch,
   no structured outputs, whose grammar would have to accept and roll back drafts (vLLM V1
   does; not needed here yet); newest token real) gets up to min(k, max_tokens - num_output - 1,
   max_model_len - num_tokens - 1) drafts in `spec_token_ids`, so that accepting them all
   plus the bonus token never passes a length limit.
2. schedule() counts them against the budget: a request's scheduled n may cut them short.
   `scheduled_drafts` reads what was scheduled: the first n - (num_tokens - num_computed).
3. `widen`: the step's logits rows become d + 1 per drafted request (verify.logits_rows).
4. `sample`: drafted requests are verified (verify.py), the others sampled by the sampler as
   in a plain step; the step is cut back to known + accepted tokens per request, so
   update_from_output sees the accepted drafts as computed and appends them with the bonus.
5. `trim`: each unfinished request whose step was cut gives back the blocks past its
   computed tokens (BlockManager.trim); they held only rejected drafts, never hashed.

Async scheduling: a decode whose newest token is the placeholder of the step in flight cannot
be drafted for. `wants_real_tokens` asks the drafter about the tokens before the placeholder
(a lagged look-up); only when one would match does the engine wait for the step in flight
first (a draft model always would: every eligible decode makes the engine wait). A workload
where nothing matches keeps its async overlap, and a step with scheduled drafts always runs
serially (its samples are read on the host).

CUDA graphs: decode graphs are captured for one token per request, so a step with drafts runs
the (compiled) body without a graph; steps without drafts replay graphs as before. A draft
model's own runner replays its graphs for its one-token-per-request forwards (all but the
first of each proposal).

Drafters (drafter.py): the n-gram prompt lookup (ngram.py), built here from the config, or
the draft model (draft_model.py), built by the engine and passed in. `propose` hands the
drafter every eligible request at once (`propose_batch`), so a model drafts them in one pass.

Not hurting when it does not help: drafts are proposed only as adaptive.py allows (fewer
drafts after partial acceptance; a request rejected outright backs off, its re-probes lined up
with every other backing-off request's on the same steps; one with nothing to draft for 8 steps
is looked up every 4th step), and not at all in a step that starts with at least
`disable_by_batch_size` running requests (config.py; None: never disabled).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from enginespec.engine.spec_decode.adaptive import AdaptiveDrafting
from enginespec.engine.spec_decode.config import SpeculativeConfig
from enginespec.engine.spec_decode.drafter import Drafter
from enginespec.engine.spec_decode.ngram import NgramDrafter
from enginespec.engine.spec_decode.stats import SpecDecodeStats
from enginespec.engine.spec_decode.verify import logits_rows, verify
from enginespec.sample.sampler import GREEDY_EPS
from enginespec.spec import Status


class SpecDecoder:
    """Drafter, verifier and counters of one engine."""

    def __init__(
        self,
        config: SpeculativeConfig,
        sampler,
        device,
        max_model_len: int,
        seed: Optional[int] = 0,
        drafter: Optional[Drafter] = None,
    ):
        """`drafter`: the engine builds the draft-model drafter (it needs the engine's impl and a
        runner); None builds the n-gram drafter from `config`. `seed`: the engine's seed, which
        seeds the verifier's generator; None (an unseeded engine) seeds it from fresh entropy,
        as the sampler's own unseeded generator is (`random.Random(None)`)."""
        self.config = config
        self.sampler = sampler
        self.max_model_len = max_model_len
        if drafter is None:
            if config.method != "ngram":
                raise ValueError(
                    f"speculative_config.method {config.method!r} needs a drafter built by the engine"
                )
            drafter = NgramDrafter(
                config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
            )
        self.drafter = drafter
        self.seed = seed
        self.request_stats: dict[str, SpecDecodeStats] = {}
        self.generator = torch.Generator(device=torch.device(device))
        self.reset()

    def reset(self) -> None:
        """Back to the state of construction, as the engine's warm-up leaves it: counters from
        zero, the verifier's generator re-seeded, the adaptive drafting's clock at step 0 with
        no request backing off. Both the generator (random rows' accept draws and residual
        draws) and the clock (which steps re-probe a backed-off request) decide unseeded
        outputs, so a warmed-up engine then speculates exactly as a cold one. Call it with no
        request running (the drafter's per-request state goes with each request: `forget`).
        Re-seeding an unseeded decoder takes fresh entropy (`torch.Generator.seed`), so two
        unseeded engines never share their accept and residual draws."""
        self.stats = SpecDecodeStats()
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)
        self._drafted: list = []
        self._num_steps = 0  # proposals made (the adaptive drafting's clock)
        self.adaptive = AdaptiveDrafting(self.config.num_speculative_tokens)
        self.num_disabled_steps = 0  # steps proposed nothing by disable_by_batch_size
        self._lagged: Optional[str] = None  # the request wants_real_tokens waited for

    # ---- proposing ----------------------------------------------------------------------------

    def _limit(self, r) -> int:
        """Drafts r may take, >= 0: accepting all of them and the bonus stays within its limits
        (num_output_tokens read as num_tokens - num_prompt_tokens: this runs per request per
        step)."""
        if r.status is not Status.RUNNING:
            return 0
        num = r.num_tokens
        if r.num_computed_tokens != num - 1:
            return 0
        p = r.params
        if p.logprobs is not None or (p.seed is not None and p.temperature >= GREEDY_EPS):
            return 0  # logprobs of drafts are not computed; a seeded row keeps its own draws
        if p.structured_outputs is not None:
            return 0  # the grammar masks one position at a time (structured_output.py)
        # never negative: a prompt of exactly max_model_len (its one token at the last prompt
        # position) leaves max_model_len - num - 1 = -1
        return max(0, min(p.max_tokens - (num - r.num_prompt_tokens) - 1, self.max_model_len - num - 1))

    def clear(self) -> None:
        """Drop every draft proposed for the last step."""
        for r in self._drafted:
            r.spec_token_ids = []
        self._drafted = []

    def disabled(self, running) -> bool:
        """Whether a step starting with these running requests proposes nothing (the
        config's disable_by_batch_size: at least that many running)."""
        bound = self.config.disable_by_batch_size
        return bound is not None and len(running) >= bound

    def wants_real_tokens(self, running, placeholder: int) -> bool:
        """Whether some decode waiting for a placeholder's real id would get drafts (looked up
        on the tokens before the placeholder): the engine then resolves the step in flight."""
        if self.disabled(running):
            return False
        step, allowed = self._num_steps + 1, self.adaptive.allowed
        waiting = [
            r
            for r in running
            if r.token_ids[-1] == placeholder and allowed(r.request_id, step) and self._limit(r) >= 1
        ]
        found = self.drafter.first_to_propose(waiting, [len(r.token_ids) - 1 for r in waiting])
        if found is None:  # all looked up, nothing found (else propose looks them up again)
            for r in waiting:
                self.adaptive.empty(r.request_id, step)
            return False
        self._lagged = waiting[found].request_id
        return True

    def propose(self, running, placeholder: int) -> int:
        """Give each eligible running decode its drafts, at most what adaptive drafting allows
        it (module docstring); returns how many requests got some. Nothing at all when the
        batch is at disable_by_batch_size."""
        self.clear()
        self._num_steps += 1
        if self.disabled(running):
            self.num_disabled_steps += 1
            self._lagged = None
            return 0
        step, allowed = self._num_steps, self.adaptive.allowed
        chosen, limits = [], []
        for r in running:
            if r.token_ids[-1] == placeholder:
                continue
            limit = allowed(r.request_id, step)
            if limit and (limit := min(limit, self._limit(r))) >= 1:
                chosen.append(r)
                limits.append(limit)
        proposals = self.drafter.propose_batch(chosen, [r.num_tokens for r in chosen], limits)
        for r, drafts in zip(chosen, proposals):
            if drafts:
                r.spec_token_ids = drafts
                self._drafted.append(r)
            elif r.request_id == self._lagged:  # the engine waited for nothing: a miss
                self.adaptive.miss(r.request_id, step)
            else:
                self.adaptive.empty(r.request_id, step)
        self._lagged = None
        return len(self._drafted)

    # ---- one step with drafts ------------------------------------------------------------------

    @staticmethod
    def scheduled_drafts(output) -> dict[str, list[int]]:
        """request id -> the drafts the scheduler kept this step (non-empty lists only)."""
        found = {}
        for r, n in output.scheduled:
            if r.spec_token_ids:
                d = n - (r.num_tokens - r.num_computed_tokens)
                if d > 0:
                    found[r.request_id] = list(r.spec_token_ids[:d])
        return found

    @staticmethod
    def widen(batch, output, drafts: dict[str, list[int]]):
        """The batch with d + 1 logits rows per drafted request (host-side row arithmetic)."""
        starts = batch.meta.query_start_loc_cpu.tolist()
        last = {r.request_id: starts[i + 1] - 1 for i, (r, _) in enumerate(output.scheduled)}
        rids = batch.sample_request_ids
        rows = logits_rows([last[rid] for rid in rids], [len(drafts.get(rid, ())) for rid in rids])
        index = torch.tensor(rows, dtype=torch.int64).to(batch.logits_indices.device)
        return dataclasses.replace(batch, logits_indices=index)

    def sample(self, output, sample_ids: list[str], logits: torch.Tensor, request_of: Callable, drafts: dict):
        """(cut SchedulerOutput, {id: tokens to append}, {id: logprobs}) of a widened step."""
        plain_rows, plain_ids, spec_rows, spec_ids = [], [], [], []
        k = 0
        for rid in sample_ids:
            d = len(drafts.get(rid, ()))
            if d:
                spec_rows.extend(range(k, k + d + 1))
                spec_ids.append(rid)
            else:
                plain_rows.append(k)
                plain_ids.append(rid)
            k += d + 1
        tokens: dict[str, list[int]] = {}
        logprobs: dict = {}
        saved_plan = getattr(self.sampler, "_last_plan", None)  # the plain steps' plan, kept
        if plain_ids:
            sub = logits.index_select(0, torch.tensor(plain_rows, dtype=torch.long, device=logits.device))
            out = self.sampler(sub, [request_of(rid) for rid in plain_ids])
            tokens.update((rid, [t]) for rid, t in zip(plain_ids, out.token_ids))
            logprobs.update(zip(plain_ids, out.logprobs))
        index = torch.tensor(spec_rows, dtype=torch.long, device=logits.device)
        requests = [request_of(rid) for rid in spec_ids]
        result = verify(
            self.sampler,
            logits.index_select(0, index),
            requests,
            [drafts[rid] for rid in spec_ids],
            self.generator,
        )
        if saved_plan is not None:
            self.sampler._last_plan = saved_plan
        accepted = dict(zip(spec_ids, result.num_accepted))
        tokens.update(zip(spec_ids, result.token_ids))
        for rid, a in accepted.items():
            self._observe(rid, len(drafts[rid]), a)
        scheduled = [
            (r, n - len(drafts[r.request_id]) + accepted[r.request_id])
            if r.request_id in accepted
            else (r, n)
            for r, n in output.scheduled
        ]
        return dataclasses.replace(output, scheduled=scheduled), tokens, logprobs

    def reset_stats(self) -> None:
        """Engine counters from zero (the warm-up's are not the user's)."""
        self.stats = SpecDecodeStats()

    def track(self, request_id: str) -> SpecDecodeStats:
        """The counters of one request (created on first use, dropped by forget)."""
        per = self.request_stats.get(request_id)
        if per is None:
            per = self.request_stats[request_id] = SpecDecodeStats()
        return per

    def _observe(self, rid: str, num_drafts: int, num_accepted: int) -> None:
        self.stats.observe(num_drafts, num_accepted)
        self.track(rid).observe(num_drafts, num_accepted)
        self.adaptive.observe(rid, num_drafts, num_accepted, self._num_steps)

    @staticmethod
    def trim(output, cut, block_manager) -> None:
        """Give back the rejected drafts' blocks of every unfinished request the step cut."""
        for (r, n), (_, kept) in zip(output.scheduled, cut.scheduled):
            if kept < n and not r.status.is_finished:
                block_manager.trim(r, r.num_computed_tokens)

    def forget(self, request_id: str) -> None:
        """A request the engine forgot: its index and counters go."""
        self.drafter.forget(request_id)
        self.request_stats.pop(request_id, None)
        self.adaptive.forget(request_id)
