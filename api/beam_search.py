"""Beam search over the engine, by vLLM V1's rules: the value types, the score, and the search
loop (LLM.beam_search wires it to LLM.generate).

    from enginespec.beam_search import BeamSearchParams
    outs = llm.beam_search(["The capital of France is"], BeamSearchParams(beam_width=4, max_tokens=16))
    best = outs[0].sequences[0]     # best first: .tokens (prompt included), .text, .cum_logprob

The rules are vLLM's (vllm/entrypoints/llm.py `LLM.beam_search`, moved to
vllm/entrypoints/generate/beam_search/offline.py in later releases; the types and the score in
vllm/beam_search.py; BeamSearchParams in vllm/sampling_params.py):

- Every prompt starts as one beam: its own tokens. One step asks the engine, for every live beam
  of every prompt at once, for one token with the logprobs of its 2 * beam_width likeliest next
  tokens (SamplingParams(max_tokens=1, logprobs=2 * beam_width, temperature=params.temperature)).
  Each (beam, token) pair of those dicts is a candidate whose cum_logprob is the beam's plus the
  token's logprob. Logprobs are of the raw distribution (sample/sampler.py), so temperature > 0
  changes only the drawn token, which the engine always reports and so joins the candidates.
- A candidate ending in EOS (the tokenizer's eos_token_id; the model's without a tokenizer) is
  finished, unless ignore_eos: it joins its prompt's `completed` list (every one of them, with
  no cap) and grows no further. The other candidates of the prompt are ranked by score and the
  best beam_width are the next step's beams.
- The search ends after max_tokens steps, sooner for a prompt whose beams reach the engine's
  max_model_len (they stop there, "length") or that has no live beam left. Then `completed` plus
  the live beams are ranked by score and the best beam_width returned, best first.
- score = cum_logprob / L ** length_penalty, where L = len(tokens), the prompt included, one
  less when the last token is EOS, under ignore_eos too (get_beam_search_score). Higher is better; candidates of equal
  score keep the order they were made in (beams in rank order, each beam's tokens in its logprob
  dict's order), as Python's stable sort does in vLLM.

Each returned BeamSearchSequence holds the prompt and generated token ids (an ending EOS
included), one logprob dict per generated token (that step's candidates), cum_logprob, and the
text: the tokenizer's decode of every token, the prompt's included, as vLLM's LLM.beam_search
decodes them (special tokens kept), but without the ending EOS unless
include_stop_str_in_output (this module's reading of that field; vLLM's LLM always decodes the
EOS, and vLLM's server, the one place vLLM reads the field, keeps the EOS in a choice's token
ids with it but never in its text, as entrypoints/openai/serving_beam.py does). finish_reason is
"stop" (with stop_reason the EOS id) for a sequence EOS ended, else "length": vLLM's server sets
both this way, its LLM leaves them None.

run_beam_search drives the steps through a plain function (LLM.beam_search);
run_beam_search_async through a coroutine function (the OpenAI server's use_beam_search, one
batch of engine requests per step); both share the batching, expansion and ranking code, and
best_sequences is the ranking that finish (the text) and the server build on.

Cost: a step re-submits every beam whole, but the engine's prefix cache serves the full blocks
the beam shares with the earlier steps, so a step computes little more than its last block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

from tqdm.auto import tqdm

from enginespec.outputs import Logprob
from enginespec.spec.validation import check_int, check_real

__all__ = [
    "BeamSearchInstance",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "best_sequences",
    "check_beam_width",
    "create_sort_beams_key_function",
    "get_beam_search_score",
    "run_beam_search",
    "run_beam_search_async",
]


def _check(cond: bool, name: str, bound: str, value: object) -> None:
    if not cond:
        raise ValueError(f"BeamSearchParams.{name} must be {bound}, got {value!r}")


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's beam search settings, under its names and defaults. Checked on construction: a bad
    value is a ValueError naming the field and its bound. beam_width an int >= 1 (the engine
    also needs 2 * beam_width within its max_logprobs and vocabulary: check_beam_width); max_tokens an int
    >= 1; temperature finite >= 0; length_penalty finite (any sign: < 0 favours longer
    sequences, 0 ranks by cum_logprob alone); ignore_eos and include_stop_str_in_output bools."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = check_int("BeamSearchParams", name, getattr(self, name))
            _check(value >= 1, name, ">= 1", value)
            object.__setattr__(self, name, value)
        temperature = check_real("BeamSearchParams", "temperature", self.temperature)
        _check(temperature >= 0.0, "temperature", ">= 0", temperature)
        object.__setattr__(self, "temperature", temperature)
        penalty = check_real("BeamSearchParams", "length_penalty", self.length_penalty)
        object.__setattr__(self, "length_penalty", penalty)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` are the prompt's ids then the generated ones; `logprobs` has one dict
    per generated token (the candidates of that step, the chosen token among them); cum_logprob
    sums the chosen tokens' logprobs. text, finish_reason and stop_reason are set only on the
    sequences a search returns (module doc)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[int] = None


@dataclass
class BeamSearchOutput:
    """One prompt's result: at most beam_width sequences, best score first."""

    sequences: list[BeamSearchSequence]


@dataclass
class BeamSearchInstance:
    """One prompt's search. Invariants: every live beam has the prompt's tokens plus as many
    generated ones as steps were run (`max_steps - steps_left`), none of them a finishing EOS;
    `completed` holds the sequences EOS ended, each once; at most beam_width live beams."""

    prompt_token_ids: list[int]
    max_steps: int  # max_tokens, or fewer where max_model_len leaves less room
    cache_salt: Optional[str] = None  # a dict prompt's cache_salt, kept by every step's prompt
    beams: list[BeamSearchSequence] = field(default_factory=list)
    completed: list[BeamSearchSequence] = field(default_factory=list)
    steps_left: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.beams:
            self.beams = [BeamSearchSequence(list(self.prompt_token_ids))]
        self.steps_left = self.max_steps

    @property
    def live(self) -> bool:
        return bool(self.beams) and self.steps_left > 0


def get_beam_search_score(
    tokens: Sequence[int], cumulative_logprob: float, eos_token_id: Optional[int], length_penalty: float = 1.0
) -> float:
    """vLLM's score: cumulative_logprob / L ** length_penalty, L = len(tokens) (the prompt's
    included), one less when tokens end with EOS. L >= 1 for every scored sequence: it holds a
    non-empty prompt and one generated token at least. Where L ** length_penalty leaves the
    floats (a large |length_penalty|: 30 ** 300 overflows, 30 ** -300 is 0.0), the score is its
    limit: 0 for an overflowing divisor (-inf for a cum_logprob of -inf), -inf for a vanishing
    one (0 for a cum_logprob of 0), where vLLM raises OverflowError or ZeroDivisionError."""
    length = len(tokens)
    if tokens and tokens[-1] == eos_token_id:
        length -= 1
    try:
        divisor = length**length_penalty
    except OverflowError:
        return -math.inf if cumulative_logprob == -math.inf else 0.0
    if divisor == 0.0:
        return -math.inf if cumulative_logprob < 0 else 0.0
    return cumulative_logprob / divisor


def create_sort_beams_key_function(
    eos_token_id: Optional[int], length_penalty: float
) -> Callable[[BeamSearchSequence], float]:
    """The sort key of sequences by get_beam_search_score (sort with reverse=True: best first)."""

    def key(seq: BeamSearchSequence) -> float:
        return get_beam_search_score(seq.tokens, seq.cum_logprob, eos_token_id, length_penalty)

    return key


#: One step of the engine: for each (token ids, cache salt) to extend, the logprob dict of its
#: next token (the candidates), or None when the engine gave none.
StepFn = Callable[[list[tuple[list[int], Optional[str]]]], list[Optional[dict[int, Logprob]]]]
#: The same step for run_beam_search_async: a coroutine function.
AsyncStepFn = Callable[[list[tuple[list[int], Optional[str]]]], Awaitable[list[Optional[dict[int, Logprob]]]]]


def expand(
    instance: BeamSearchInstance,
    candidates: Sequence[Optional[dict[int, Logprob]]],
    params: BeamSearchParams,
    eos_token_id: Optional[int],
) -> None:
    """One step of one prompt: every beam times its candidates (one dict per beam, in beam
    order); those ending in EOS (unless ignore_eos) go to `completed` with finish_reason "stop",
    the best beam_width of the rest are the new beams."""
    key = create_sort_beams_key_function(eos_token_id, params.length_penalty)
    grown: list[BeamSearchSequence] = []
    for beam, cands in zip(instance.beams, candidates):
        if cands is None:  # the engine gave this beam no token: it ends here, as in vLLM
            continue
        for token, logprob in cands.items():
            child = BeamSearchSequence(
                beam.tokens + [token], beam.logprobs + [cands], beam.cum_logprob + float(logprob)
            )
            if token == eos_token_id and not params.ignore_eos:
                child.finish_reason, child.stop_reason = "stop", eos_token_id
                instance.completed.append(child)
            else:
                grown.append(child)
    grown.sort(key=key, reverse=True)
    instance.beams = grown[: params.beam_width]
    instance.steps_left -= 1


def _step_batch(
    instances: Sequence[BeamSearchInstance],
) -> tuple[list[BeamSearchInstance], list[tuple[list[int], Optional[str]]]]:
    """The live instances and one step's batch: (tokens, cache salt) of each of their beams."""
    live = [inst for inst in instances if inst.live]
    return live, [(beam.tokens, inst.cache_salt) for inst in live for beam in inst.beams]


def _grow(
    live: Sequence[BeamSearchInstance],
    num_beams: int,
    results: Sequence[Optional[dict[int, Logprob]]],
    params: BeamSearchParams,
    eos_token_id: Optional[int],
) -> None:
    """Expand each live instance by its beams' slice of one step's results (batch order)."""
    if len(results) != num_beams:
        raise RuntimeError(f"a beam search step returned {len(results)} results for {num_beams} beams")
    start = 0
    for inst in live:
        end = start + len(inst.beams)
        expand(inst, results[start:end], params, eos_token_id)
        start = end


def search_step(
    instances: Sequence[BeamSearchInstance],
    step: StepFn,
    params: BeamSearchParams,
    eos_token_id: Optional[int],
) -> bool:
    """Grow every live instance by one token with one call of `step` over all their beams.
    Returns whether any instance was live."""
    live, batch = _step_batch(instances)
    if not live:
        return False
    _grow(live, len(batch), step(batch), params, eos_token_id)
    return True


async def run_beam_search_async(
    instances: Sequence[BeamSearchInstance],
    step: AsyncStepFn,
    params: BeamSearchParams,
    eos_token_id: Optional[int],
) -> None:
    """run_beam_search for asyncio callers (the OpenAI server): the same steps over an awaited
    `step`, every instance at once, until none is live (each stops after its max_steps)."""
    while True:
        live, batch = _step_batch(instances)
        if not live:
            return
        _grow(live, len(batch), await step(batch), params, eos_token_id)


class NoProgressBar:
    """What a progress bar turned off (use_tqdm=False) is: tqdm's calls, doing nothing. Not
    tqdm(disable=True): tqdm starts its monitor thread for every bar, a disabled one too, and
    that thread then lives as long as the host process, which never asked for a bar."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoProgressBar":
        return self

    def __exit__(self, *exc_info) -> None:
        pass


def run_beam_search(
    instances: Sequence[BeamSearchInstance],
    step: StepFn,
    params: BeamSearchParams,
    eos_token_id: Optional[int],
    *,
    use_tqdm: bool = False,
    concurrency_limit: Optional[int] = None,
) -> None:
    """Run the search of every instance to its end (module doc), `concurrency_limit` prompts at
    a time (None: all at once; a group's steps batch its beams in one `step` call each). The
    progress bar counts token steps, up to max_tokens per group (a group may end sooner)."""
    group = max(len(instances), 1) if concurrency_limit is None else _group_size(concurrency_limit)
    groups = [instances[i : i + group] for i in range(0, len(instances), group)]
    total = params.max_tokens * len(groups)
    with tqdm(total=total, desc="Beam search", unit="token") if use_tqdm else NoProgressBar() as bar:
        for batch in groups:
            steps = 0
            while steps < params.max_tokens and search_step(batch, step, params, eos_token_id):
                steps += 1
                bar.update(1)
            bar.update(params.max_tokens - steps)


def check_beam_width(params: BeamSearchParams, max_logprobs: int, vocab_size: int) -> None:
    """A ValueError naming beam_width unless a step's 2 * beam_width candidates fit both bounds
    on the logprobs a request may ask for: the engine's max_logprobs (-1: none) and the
    vocabulary (there are no more candidates than tokens, whatever max_logprobs allows)."""
    bound = vocab_size if max_logprobs == -1 else min(max_logprobs, vocab_size)
    if 2 * params.beam_width > bound:
        raise ValueError(
            f"BeamSearchParams.beam_width must be <= {bound // 2} (each step asks for 2 * beam_width "
            f"logprobs, within the engine's max_logprobs ({max_logprobs}; -1 lifts it) and the "
            f"vocabulary ({vocab_size} tokens)), got {params.beam_width}"
        )


def _group_size(concurrency_limit: object) -> int:
    """concurrency_limit as an int >= 1, or a ValueError naming it."""
    limit = check_int("beam_search", "concurrency_limit", concurrency_limit)
    if limit < 1:
        raise ValueError(f"beam_search.concurrency_limit must be None or >= 1, got {limit!r}")
    return limit


def best_sequences(
    instance: BeamSearchInstance, params: BeamSearchParams, eos_token_id: Optional[int]
) -> list[BeamSearchSequence]:
    """The instance's result without text: completed and live beams ranked by score, the best
    beam_width, each with its finish_reason ("length" where EOS did not end it)."""
    key = create_sort_beams_key_function(eos_token_id, params.length_penalty)
    best = sorted(instance.completed + instance.beams, key=key, reverse=True)[: params.beam_width]
    for seq in best:
        if seq.finish_reason is None:
            seq.finish_reason = "length"
    return best


def finish(
    instance: BeamSearchInstance,
    params: BeamSearchParams,
    eos_token_id: Optional[int],
    decode: Optional[Callable[[list[int]], str]],
) -> BeamSearchOutput:
    """best_sequences, each with its text (decode of its tokens, the prompt's included; "" without
    `decode`; an ending EOS left out unless include_stop_str_in_output)."""
    best = best_sequences(instance, params, eos_token_id)
    for seq in best:
        ids = seq.tokens
        if seq.finish_reason == "stop" and not params.include_stop_str_in_output:
            ids = ids[:-1]
        seq.text = decode(ids) if decode is not None else ""
    return BeamSearchOutput(best)
