"""One engine request as the front end sees it: the cumulative RequestOutput its deltas build.

The engine sends per-sample deltas (engine/core_messages.py); this folds them into a
RequestOutput that grows in place (token ids, logprobs, text), so the handlers read cumulative
outputs exactly as LLM.generate returns them. Samples the engine does not detokenize (no stop
strings) are decoded here, with the engine's own IncrementalDetokenizer and the request's
params (skip_special_tokens, spaces_between_special_tokens; none with detokenize=False), so the
text equals what the engine would have produced.

The Logprobs of a sample decoded here (and its prompt logprobs) get their decoded_token here,
`tokenizer.decode([id])` as the engine names those of the samples it detokenizes, so they equal
LLM.generate's with or without stop strings.

A sample ended by a stop token (or EOS) gets that token's id but not its text, unless it asked
include_stop_str_in_output (the engine's rule, engine/output_processor.py): the token arrives in
the delta that carries the finish, so its text is never emitted first.

A tokenizer that raises decoding a request's ids (a slow SentencePiece tokenizer on an id of a
padded vocabulary, a tiktoken one on an id it never had) fails that request alone: `apply`
raises DecodeError, which the engine client answers by failing and aborting the request, where
any other exception of the reader ends the client as a bug.

Invariants: a sample's text only grows; finish_reason is set once, by the sample's last delta;
`output.finished` is True exactly when every sample has its finish_reason.
"""

from __future__ import annotations

from typing import Optional

from enginespec.engine.core_messages import NewRequest
from enginespec.engine.detokenizer import IncrementalDetokenizer
from enginespec.engine.output_processor import shown_ids
from enginespec.outputs import CompletionOutput, RequestOutput


class DecodeError(RuntimeError):
    """The tokenizer raised decoding one request's ids: that request fails, not the reader."""


class RequestStream:
    """Per-request front-end state: where its news goes, its output, its latency marks."""

    def __init__(
        self,
        req: NewRequest,
        sink,
        tokenizer,
        arrival: float,
        token_texts: Optional[dict] = None,
        prompt_only: bool = False,
    ):
        n = req.params.n
        self.request_id = req.request_id
        self.sink = sink
        self.num_samples = n
        self.num_prompt_tokens = len(req.prompt_token_ids)
        self.arrival = arrival
        # the client is answered its prompt alone (echo with max_tokens 0): the token each sample
        # draws is the engine's need (it computes the prompt's logprobs only for a request that
        # draws one), not the client's, and the metrics count none of it (answered_tokens); its
        # max_tokens is the 0 the client sent, not the engine's 1
        self.prompt_only = prompt_only
        self.max_tokens = 0 if prompt_only else req.params.max_tokens
        # per sample: when its first and its latest token arrived, and when the step that carried
        # its first tokens started (the latency metrics are per sample, as vLLM's are per child
        # request of n > 1)
        self.first: list[Optional[float]] = [None] * n
        self.last: list[Optional[float]] = [None] * n
        self.scheduled: list[Optional[float]] = [None] * n
        with_lps = req.params.logprobs is not None
        self.output = RequestOutput(
            req.request_id,
            req.prompt,
            list(req.prompt_token_ids),
            [
                CompletionOutput(
                    i, logprobs=[] if with_lps else None, cumulative_logprob=0.0 if with_lps else None
                )
                for i in range(n)
            ],
            num_cached_tokens=0,  # as the engine's outputs (and vLLM's) read before the first step
        )
        decode_here = tokenizer is not None and req.params.detokenize and not req.params.stop
        self._detoks = [
            IncrementalDetokenizer(tokenizer, req.prompt_token_ids, req.params) if decode_here else None
            for _ in range(n)
        ]
        self._num_finished = 0
        self._params = req.params
        # set by the engine's reply to this request's add: news under this id from before it is
        # an aborted request's of the same id (EngineClient._handle skips it)
        self.accepted = False
        # token id -> its text (shared by the client's streams) where Logprobs are named here
        self._tokenizer = tokenizer if decode_here else None
        # the engine decodes samples with stop strings, holding back a tail (finish_aborted)
        self._engine_tokenizer = tokenizer if tokenizer is not None and req.params.detokenize else None
        self._token_texts = token_texts if token_texts is not None else {}

    def apply(self, delta: tuple) -> int:
        """Fold one SampleDelta-shaped tuple in; returns how many new token ids it carried."""
        _, index, new_ids, new_lps, new_text, finish, stop, error, prompt_lps, cached = delta
        c = self.output.outputs[index]
        if cached is not None:
            self.output.num_cached_tokens = cached
        det = self._detoks[index]
        if new_ids:
            c.token_ids.extend(new_ids)
            if det is not None:
                token_stop = finish == "stop" and not isinstance(stop, str)  # a token id, or EOS
                c.text += self._decode(det.update, shown_ids(new_ids, token_stop, self._params))[0]
        if new_lps:
            self._decode(self._name_tokens, new_lps)
            c.logprobs.extend(new_lps)
            _add_sampled_logprobs(c, new_lps)
        if new_text:
            c.text += new_text
        if prompt_lps is not None:
            self._decode(self._name_tokens, prompt_lps)
            self.output.prompt_logprobs = prompt_lps
        if finish is not None and c.finish_reason is None:
            if det is not None:
                c.text += self._decode(det.flush)
            c.finish_reason, c.stop_reason, c.error = finish, stop, error
            self._num_finished += 1
            self.output.finished = self._num_finished == self.num_samples
        return len(new_ids)

    def answered_tokens(self, index: int) -> int:
        """The tokens sample `index` generated as its client is answered them: none for a
        prompt-only request (usage.completion_tokens 0), else every one it got."""
        return 0 if self.prompt_only else len(self.output.outputs[index].token_ids)

    def answered_reason(self, index: int) -> Optional[str]:
        """Sample `index`'s finish reason as its client is answered it: "length" for a finished
        sample of a prompt-only request (its prompt alone, whatever ended the draw), else the
        engine's; None while it runs."""
        reason = self.output.outputs[index].finish_reason
        return "length" if self.prompt_only and reason is not None else reason

    def _decode(self, fn, *args):
        """fn(*args), a call that decodes this request's ids; DecodeError if the tokenizer raised."""
        try:
            return fn(*args)
        except Exception as exc:
            raise DecodeError(
                f"the tokenizer failed to decode the output of request {self.request_id!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _name_tokens(self, entries: list) -> None:
        """Give the Logprobs of `entries` (dicts {token id: Logprob}, or None) their
        decoded_token when this request's text is decoded here (the engine named the others)."""
        if self._tokenizer is None:
            return
        texts = self._token_texts
        for entry in entries:
            for token, logprob in (entry or {}).items():
                text = texts.get(token)
                if text is None:
                    text = texts[token] = self._tokenizer.decode([token]) or ""
                logprob.decoded_token = text

    def finish_aborted(self) -> None:
        """End every unfinished sample with finish_reason "abort" (the output is then final):
        what an aborted request's consumer gets where one still listens (AsyncLLM.abort). Its
        text is all of it, as a finished sample's (vLLM's abort output): what this side's
        detokenizer still held, or the tail the engine held of a sample it decodes."""
        for c, det in zip(self.output.outputs, self._detoks):
            if c.finish_reason is None:
                c.text += det.flush() if det is not None else self._engine_held_text(c)
                c.finish_reason = "abort"
        self._num_finished = self.num_samples
        self.output.finished = True

    def _engine_held_text(self, sample: CompletionOutput) -> str:
        """The text the engine still held of an unfinished sample it decodes (one with stop
        strings): the tail that could still grow into a stop string, and the bytes of a
        character not yet complete. The engine would show it once the sample ended, but an
        abort ends it here before the engine hears of it, so the sample's ids are decoded again
        as the engine decoded them (its IncrementalDetokenizer, the request's params) and the
        tail is what that text adds to the text shown. "" where the replay disagrees with the
        shown text, or the tokenizer raises: the text shown is never made wrong. Costs two
        short decodes per id, once, at an abort."""
        if self._engine_tokenizer is None or not self._params.stop or not sample.token_ids:
            return ""
        try:
            det = IncrementalDetokenizer(self._engine_tokenizer, self.output.prompt_token_ids, self._params)
            det.update(sample.token_ids)
            det.flush()
        except Exception:
            return ""
        if det.stop_reason is not None or not det.text.startswith(sample.text):
            return ""
        return det.text[len(sample.text) :]


def _add_sampled_logprobs(sample: CompletionOutput, logprobs: list[dict]) -> None:
    """Add each position's sampled-token logprob (its dict's first entry, as the engine put it
    there) to sample.cumulative_logprob, one at a time in order: the engine's own sum, bit for
    bit."""
    for entry in logprobs:
        if entry:
            sample.cumulative_logprob += float(next(iter(entry.values())))
