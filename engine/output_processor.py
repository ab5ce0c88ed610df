"""Output processing: what the engine does with a step's tokens once the scheduler has them.

The engine loop is schedule -> execute -> sample -> update (Scheduler.update_from_output, which
applies the token stop rules of spec.stops) -> process outputs (this module): attach tokens and
logprobs to samples (the sampler's `Logprob`s, given their decoded_token here when the sample
detokenizes), detokenize, match stop strings, and build the cumulative RequestOutputs.

A sample's final reason lives here, on the engine's side (`Sample.finish_reason`,
`Sample.stop_reason`, `Sample.error`); the impl's Request is changed only through the
Scheduler API (finish) and Request.append / replace_last_token. So a stop string that ends a
request the scheduler had just finished for length, or an async stop token found one step
late, changes what the user sees without writing to the impl's request.

A tokenizer that raises decoding a sample's ids (a slow SentencePiece tokenizer on an id of a
padded vocabulary, a tiktoken one on an id it never had) fails that sample alone: it ends with
finish_reason "error" and the tokenizer's error, keeps its tokens and drops its text, and a
request still running is finished through the Scheduler API (its blocks freed). The step's
forward and sampling succeeded, so every other request goes on as if nothing happened (its
own siblings fail with it: EngineCore._fail_siblings).

Invariants: a sample's finish_reason is set once, except that a sample whose ids cannot be
decoded ends as "error" (before any output shows its earlier reason: the decode happens in
the same step); an output never shows an async placeholder token (the id `placeholder_id`,
which no real token can be); a parent is reported finished exactly when every sample has a
finish_reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from enginespec.outputs import CompletionOutput, Logprob, RequestOutput
from enginespec.spec import Status, UpdateOutput

#: finish_reason of a sample whose step failed (the message is in CompletionOutput.error).
ERROR = "error"


@dataclass
class Sample:
    """One sibling: the impl's request plus what only the engine tracks (text, logprobs)."""

    index: int
    request: object
    detokenizer: object = None
    unread: list = field(default_factory=list)  # sampled ids not yet fed to the detokenizer
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[list] = None
    cumulative_logprob: Optional[float] = None  # 0.0 to start with when logprobs are asked for
    error: Optional[str] = None
    spec_decode: object = None  # this sample's SpecDecodeStats when the engine speculates
    # prompt tokens its first admission found in the prefix cache (None until its first step)
    num_cached_tokens: Optional[int] = None
    # Output ids shown to the user: None = all of the request's; after a stop string, those up
    # to the one that completed it (a speculative step appends several ids at once, and the
    # ones after the stop's must not show, as they would not have been sampled one at a time).
    num_visible: Optional[int] = None
    # structured outputs: this sample's GrammarState (engine/structured_output.py), advanced
    # with each of its real output tokens; None for an unconstrained sample
    grammar: object = None
    started: bool = False  # its first tokens came (its prompt is counted: num_prompt_tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Parent:
    """One user request and its n samples."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    samples: list[Sample]
    prompt_logprobs: Optional[dict[int, dict[int, Logprob]]] = None

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.samples)


class OutputProcessor:
    """Turns scheduler updates into per-sample text, stops and RequestOutputs.

    `finish(request, status)` is the scheduler's finish (a stop string ends a request);
    `placeholder_id` the async scheduling placeholder, hidden from every output."""

    def __init__(self, finish: Callable, placeholder_id: int):
        self._finish = finish
        self.placeholder_id = placeholder_id
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0  # each sample's prompt at its first tokens (vLLM's prompt_tokens)
        self.num_prompt_cached_tokens = 0  # of which its admission found in the prefix cache
        self._texts: dict[int, str] = {}  # token id -> its text under _texts_of (name_tokens)
        self._texts_of: object = None

    def apply_update(
        self, update: UpdateOutput, lookup: Callable, logprob_map: dict, changed: dict, late_stops=None
    ) -> None:
        """Attach new tokens (logprobs, text, stop strings), then record scheduler finishes.
        `lookup(internal_id)` gives (Parent, Sample) or None for a forgotten request.
        `late_stops` maps internal ids to the (status, stop_reason) of a stop the async path
        found one step late: it wins over the length finish the placeholder's count decided
        (the serial order of checks), as a stop string matched here wins over both."""
        token_stopped = _token_stopped(update, late_stops)
        for request_id, tokens in update.new_token_ids.items():
            found = lookup(request_id)
            if found is None:
                continue
            parent, sample = found
            changed[parent.request_id] = parent
            self.num_generated_tokens += len(tokens)
            if tokens and not sample.started:
                sample.started = True
                self.num_prompt_tokens += len(parent.prompt_token_ids)
                self.num_prompt_cached_tokens += sample.num_cached_tokens or 0
            if sample.index == 0 and parent.prompt_logprobs is not None and tokens:
                check_prompt_logprobs_complete(parent)
            if sample.logprobs is not None:
                pairs = logprob_map.get(request_id) or ()
                if pairs and sample.cumulative_logprob is not None:
                    sample.cumulative_logprob += float(pairs[0][1])  # the sampled token's, first
                entry = dict(pairs)
                if sample.detokenizer is not None:
                    self._decoding(sample, self.name_tokens, entry, sample.detokenizer.tokenizer)
                sample.logprobs.append(entry)
            if sample.detokenizer is not None:
                sample.unread.extend(shown_ids(tokens, request_id in token_stopped, sample.request.params))
                if sample.request.params.stop:
                    _, stop = self._decoding(sample, read, sample) or ("", None)
                    if stop is not None:
                        self._finish_on_stop_string(sample, stop)
                        self.num_generated_tokens -= _num_hidden(sample, len(tokens))
        for request in update.finished:
            found = lookup(request.request_id)
            if found is None:
                continue
            parent, sample = found
            changed[parent.request_id] = parent
            late = (late_stops or {}).get(request.request_id)
            if late is not None:
                self.settle(sample, late[0].finish_reason, late[1])
            else:
                self.settle(sample, request.status.finish_reason, request.stop_reason)

    def name_tokens(self, entry: dict, tokenizer) -> None:
        """Give each Logprob of `entry` ({token id: Logprob}) its decoded_token:
        tokenizer.decode([id]), the one token's text as vLLM (and our server) decode it. A
        token's text depends on nothing else, so it is decoded once per id and tokenizer."""
        if tokenizer is not self._texts_of:
            self._texts, self._texts_of = {}, tokenizer
        texts = self._texts
        for token, logprob in entry.items():
            text = texts.get(token)
            if text is None:
                text = texts[token] = tokenizer.decode([token]) or ""
            logprob.decoded_token = text

    def settle(
        self, sample: Sample, finish_reason: str, stop_reason=None, error: Optional[str] = None
    ) -> None:
        """Give the sample its final reason (first one wins) and settle its text."""
        if sample.finish_reason is not None:
            return
        sample.finish_reason, sample.stop_reason, sample.error = finish_reason, stop_reason, error
        self._decoding(sample, flush, sample)

    def _decoding(self, sample: Sample, decode: Callable, *args):
        """decode(*args), a call that decodes the sample's ids; None, with the sample failed
        (_undecodable), when the tokenizer raises."""
        try:
            return decode(*args)
        except Exception as exc:
            self._undecodable(sample, exc)
            return None

    def fail_undecodable(self, parent: Parent, exc: Exception, what: str) -> None:
        """The tokenizer raised on `what` of the parent's (its prompt logprobs): every sample
        fails as _undecodable fails one; a sample already finished keeps its reason."""
        for sample in parent.samples:
            if sample.finish_reason is None:
                self._undecodable(sample, exc, what)

    def _undecodable(self, sample: Sample, exc: Exception, what: str = "the output") -> None:
        """The tokenizer raised on the sample's ids: it ends as "error" naming that error (one
        already failed keeps its message), keeps its tokens and drops its text; a request still
        unfinished is finished through the scheduler, which frees its blocks. Its visible ids
        end at those it has now (Sample.num_visible): with async scheduling the next step is
        already in flight with it, and the token that step brings must not show after the error,
        as the serial engine never samples it."""
        if sample.num_visible is None:
            sample.num_visible = len(self.visible_ids(sample))
        sample.detokenizer, sample.unread = None, []
        if not sample.request.status.is_finished:
            self._finish(sample.request, Status.FINISHED_ABORTED)
        if sample.finish_reason != ERROR:
            sample.finish_reason, sample.stop_reason = ERROR, None
            sample.error = f"the tokenizer failed to decode {what}: {type(exc).__name__}: {exc}"

    def _finish_on_stop_string(self, sample: Sample, stop: str) -> None:
        """A stop string ends the sample as "stop" even if the scheduler just finished it for
        length in the same update (the text was cut at the stop string either way). Its
        visible ids end at the id that completed the stop string (the detokenizer has read
        every id before it, placeholders excepted, and ignores the rest)."""
        request = sample.request
        sample.num_visible = len(sample.detokenizer.output_token_ids)
        if not request.status.is_finished:
            self._finish(request, Status.FINISHED_STOPPED)
        sample.finish_reason = Status.FINISHED_STOPPED.finish_reason
        sample.stop_reason = stop

    def make_output(self, parent: Parent) -> RequestOutput:
        for sample in parent.samples:
            self._decoding(sample, read, sample)
        completions = [
            CompletionOutput(
                index=s.index,
                text=s.detokenizer.shown_text(s.finished) if s.detokenizer is not None else "",
                token_ids=self.visible_ids(s),
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
                error=s.error,
                spec_decode=None if s.spec_decode is None else copy.deepcopy(s.spec_decode),
                cumulative_logprob=s.cumulative_logprob,
            )
            for s in parent.samples
        ]
        prompt_lp = None
        if parent.prompt_logprobs is not None:
            prompt_lp = [None] + prompt_logprob_entries(parent)
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            list(parent.prompt_token_ids),
            completions,
            finished=parent.finished,
            prompt_logprobs=prompt_lp,
            num_cached_tokens=parent.samples[0].num_cached_tokens or 0,
        )

    def visible_ids(self, sample: Sample) -> list[int]:
        """The sample's output ids: its request's, without trailing async placeholders, and
        none past the id that completed a stop string (Sample.num_visible)."""
        ids = list(sample.request.output_token_ids)
        if sample.num_visible is not None:
            del ids[sample.num_visible :]
        while ids and ids[-1] == self.placeholder_id:
            ids.pop()
        return ids


class PromptLogprobsError(RuntimeError):
    """An internal error: a request's prompt logprobs lost a position (a step's prompt rows were
    computed but never stored). Raised inside the step, so the step's rollback gives its
    requests finish_reason "error" with this message, instead of a prompt_logprobs list that is
    shorter than the prompt and shifted against its tokens."""


def _missing(request_id: str, index: int, why: str) -> PromptLogprobsError:
    return PromptLogprobsError(
        f"request {request_id!r}: prompt_logprobs has no entry for prompt token {index} "
        f"(prompt_logprobs[{index}]); {why}"
    )


def store_prompt_logprobs(parent: Parent, positions, entries) -> None:
    """Record a step's prompt logprob entries in parent.prompt_logprobs: position p holds the
    logprobs of prompt token p + 1. Invariant: the keys are always 0..len - 1. A prompt's
    chunks arrive in order and a recompute after preemption starts again at 0 (prompt_logprobs
    requests take no prefix-cache hit), so a position past the next free one means an earlier
    chunk's entries were lost: PromptLogprobsError naming the request and the first missing
    prompt token, and nothing past the gap is stored."""
    found = parent.prompt_logprobs
    for pos, entry in zip(positions, entries):
        if pos > len(found):
            raise _missing(
                parent.request_id, len(found) + 1, f"the logprobs of prompt token {pos + 1} came first"
            )
        found[pos] = entry


def check_prompt_logprobs_complete(parent: Parent) -> None:
    """Once the parent's first sample has an output token its prompt was computed in full, so
    every prompt token but the first has its entry; else PromptLogprobsError naming the first
    missing one (the last chunk's entries were lost)."""
    have = len(parent.prompt_logprobs)
    if have < len(parent.prompt_token_ids) - 1:
        raise _missing(
            parent.request_id,
            have + 1,
            f"its first sample has output tokens, but only {have} of the prompt's "
            f"{len(parent.prompt_token_ids) - 1} entries were stored",
        )


def prompt_logprob_entries(parent: Parent) -> list:
    """parent.prompt_logprobs as the list after RequestOutput.prompt_logprobs' leading None:
    entry i - 1 for prompt token i. A gap (which store_prompt_logprobs refuses to make) is a
    PromptLogprobsError, never a shorter list shifted against the prompt."""
    found = parent.prompt_logprobs
    try:
        return [found[p] for p in range(len(found))]
    except KeyError as gap:  # keys 0..len - 1 are all there unless one was skipped
        raise _missing(parent.request_id, gap.args[0] + 1, "a later position has one") from None


def shown_ids(new_ids: list, token_stopped: bool, params) -> list:
    """The new ids whose text a sample shows: all, but the last when it is the stop token (or
    EOS) that ended the sample, unless it asked include_stop_str_in_output (vLLM's rule). The
    engine and the server's front end (which decodes samples without stop strings) both use it."""
    if token_stopped and not params.include_stop_str_in_output:
        return new_ids[:-1]
    return new_ids


def _num_hidden(sample: Sample, num_new: int) -> int:
    """How many of the sample's num_new newest ids its stop string hid (Sample.num_visible): a
    speculative step appends the accepted ids after the one that completed it. They are not
    generated tokens (vllm:generation_tokens counts what the outputs carry, as the server's
    counter counts what it streams)."""
    start = len(sample.request.output_token_ids) - num_new  # where this update's ids begin
    return num_new - max(0, min(num_new, sample.num_visible - start))


def _token_stopped(update: UpdateOutput, late_stops) -> set:
    """Ids of the requests this update ends by a token (a stop token or EOS, decided by the
    scheduler or found late by the async path): the last of their new ids is that token."""
    stopped = set(late_stops or ())
    stopped.update(r.request_id for r in update.finished if r.status is Status.FINISHED_STOPPED)
    return stopped


def flush(sample: Sample) -> None:
    """Settle the text of a sample that ended without a stop string (pending partial
    characters, a held-back tail that can no longer become a stop string)."""
    if sample.detokenizer is not None:
        read(sample)
        sample.detokenizer.flush()


def read(sample: Sample):
    """Feed the sample's unread ids to its detokenizer: (text delta, stop string or None)."""
    if sample.detokenizer is None or not sample.unread:
        return "", None
    tokens, sample.unread = sample.unread, []
    return sample.detokenizer.update(tokens)
