"""SamplingParams: what the user asks of one request's output. Validated on construction.

Field names and meanings follow vLLM's `SamplingParams` so its users feel at home. Every bad
value raises a ValueError that names the field and the bound it broke.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import InitVar, dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from enginespec.spec.structured_outputs import StructuredOutputsParams
from enginespec.spec.validation import MAX_LOGIT_BIAS, MAX_N, check_int, check_real, check_token_ids


def _real(
    name: str, value: object, low: Optional[float], high: Optional[float], bound: Optional[str] = None
) -> float:
    """A finite float in [low, high] (None: unbounded on that side). `bound`: the whole bound
    as the message states it, when the field's is stricter than [low, high] (an open end)."""
    value = check_real("SamplingParams", name, value)
    _check(low is None or value >= low, name, bound or f">= {low}", value)
    _check(high is None or value <= high, name, bound or f"<= {high}", value)
    return value


def _int(name: str, value: object, low: Optional[int], high: Optional[int]) -> int:
    """An int in [low, high] (None: unbounded on that side)."""
    value = check_int("SamplingParams", name, value)
    _check(low is None or value >= low, name, f">= {low}", value)
    _check(high is None or value <= high, name, f"<= {high}", value)
    return value


def _ids(name: str, ids: object) -> list[int]:
    return check_token_ids(f"SamplingParams.{name}", ids)


#: The bool fields.
_FLAGS = (
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "detokenize",
)


class RequestOutputKind(enum.IntEnum):
    """What a streaming consumer (AsyncLLM.generate, LLM.stream) gets after each engine step,
    under vLLM's names and values: CUMULATIVE everything so far (the default), DELTA only what
    is new since its previous output, FINAL_ONLY nothing but the finished output. The engine's
    decisions never depend on it; LLM.generate returns finished outputs whatever it is."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _output_kind(value: object) -> RequestOutputKind:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, 2):
        raise ValueError(
            f"SamplingParams.output_kind must be a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY), "
            f"got {value!r}"
        )
    return RequestOutputKind(value)


#: logprobs / prompt_logprobs that ask for the whole vocabulary (vLLM's rule).
ALL_LOGPROBS = -1
#: truncate_prompt_tokens that keeps up to max_model_len prompt tokens (vLLM's rule).
TRUNCATE_TO_MAX_MODEL_LEN = -1
#: The most token sequences bad_words may ban once tokenized (vLLM's VLLM_MAX_NUM_BAD_WORDS
#: default): each word can give two (with and without a leading space).
MAX_NUM_BAD_WORDS = 128
#: The seed that means "no seed" (vLLM's and OpenAI's rule): stored as None, so the request
#: draws from the engine's generator like any unseeded one instead of repeating one fixed draw.
UNSEEDED = -1
#: The seeds SamplingParams takes: torch.manual_seed's range. The sampler keys a seeded row by
#: its seed modulo 2**64, so a seed outside it would draw the stream of one inside it.
SEED_RANGE = (-(2**63), 2**64 - 1)


def _check(cond: bool, name: str, bound: str, value: object) -> None:
    if not cond:
        raise ValueError(f"SamplingParams.{name} must be {bound}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping settings of one request.

    temperature 0 means greedy (argmax); top_k 0 or -1 means no top-k cut; top_p 1 and min_p 0
    mean no cut. `max_tokens` counts output tokens; None means up to the model's max length
    (vLLM's rule): the engine sets it to max_model_len - prompt length on add, and lowers a
    larger one (and min_tokens) to that, so a request ends at the model's max length with
    finish_reason "length" as in vLLM; a Request an impl sees always carries an int that fits
    (spec.request.check_request_args refuses None). Stops: a
    token of `stop_token_ids`, the EOS token unless `ignore_eos`, a string of `stop` (the
    engine's detokenizer checks those), `max_tokens`, or the model's max length. The text ends
    before the stop string, and before the text of the stop token or EOS that ended it (its id
    stays in the output's ids), unless `include_stop_str_in_output` (vLLM's rules). No stop by
    token or string fires before `min_tokens` outputs: the sampler bans the stop ids and the
    EOS ids (under ignore_eos too) until then. `further_eos_token_ids` are EOS ids beside the
    request's own (the engine sets the checkpoint's on add: config.json's list and
    generation_config.json's, vLLM's all_stop_token_ids beyond the stop ids): like the EOS
    they end the request unless `ignore_eos` (the engine adds them to stop_token_ids, so such
    a stop reports its id as stop_reason, as vLLM's) and min_tokens bans them under
    ignore_eos too. `min_tokens` is a soft lower bound, outranked by the
    hard constraints (`allowed_token_ids`, `bad_words`, a grammar: what the user says never to
    emit): at a step where they leave nothing but stop ids, the ban yields for that step, the
    request draws an allowed stop id and ends "stop" below min_tokens; allowed ids that could
    never honour it (all stop ids, or banned by one-token bad words) are a ValueError on add.
    `n` > 1 makes sibling requests that
    share the prompt's blocks. `logprobs` = k returns the top-k log-probabilities of each sampled
    position (k = -1: the whole vocabulary, vLLM's rule; the engine sets vocab_size on add, so a
    Request never carries -1); `prompt_logprobs` = k does so for prompt positions and turns
    prefix-cache hits off for that request (cached positions have no logits).
    `best_of` is not a field: vLLM V1 dropped it, so any value but None or 1 is a ValueError
    pointing to `n`. Nor is `logits_processors`: no custom processor runs (vLLM V1 refuses
    per-request ones), so any value but None or [] is a ValueError naming the edits that exist.

    Text (vLLM's names and defaults): `skip_special_tokens` leaves special tokens (EOS,
    pad, ...) out of the text; `spaces_between_special_tokens` is passed to the tokenizer's
    decode (fast tokenizers ignore it, as vLLM's fast detokenizer does). `detokenize` False
    leaves the output's `text` "" (its token ids are returned as ever), and then `stop` must be
    empty (stop strings are matched in the text).

    Request extras (vLLM's): `bad_words` bans words. The engine tokenizes each on add
    (`with_bad_words_tokens`, vLLM's rule: the word with its leading spaces stripped, and again
    after one space where that gives as many tokens with another first one) into
    `bad_words_token_ids`, which may also be given directly (an engine without a tokenizer);
    the sampler sets a sequence's last token to -inf whenever the output so far ends with the
    rest of it, so a one-token word is never drawn and a longer one is never completed. Only
    output tokens count, as in vLLM V1 (a prompt that ends with a word's prefix bans nothing).
    Bad words, like allowed_token_ids, are hard constraints and outrank min_tokens (above).
    Allowed ids that one-token words all ban are a ValueError on add; where, mid-generation,
    words of several tokens ban every allowed id and no stop id is allowed, no token can be
    drawn: that request alone ends there with finish_reason "error", an error naming
    allowed_token_ids, bad_words_token_ids and the output token, never with an id it refuses.
    `truncate_prompt_tokens` = k keeps the last k prompt tokens (-1: the last max_model_len),
    applied by the engine on add. `extra_args` is a dict passed through untouched (vLLM's hook
    for custom samplers and plugins; nothing in the engine reads it). `logprobs` and
    `prompt_logprobs` take True as 1 (and False as 0: vLLM's rule, a bool being its int).

    Structured outputs (vLLM's): `structured_outputs` = StructuredOutputsParams(json=... |
    regex=... | choice=[...] | grammar=... | json_object=True) constrains the output to it
    (spec/structured_outputs.py; a dict of its fields is taken too). The engine compiles it
    on add with xgrammar (an optional dependency: without it, a ValueError says what to
    install) and masks, before every sample, the tokens the constraint cannot take next (EOS
    and stop tokens only where it may end); once it is complete the request finishes ("stop").
    With its start_after_token_ids set, the output is free until those ids have appeared in it
    (a reasoning model's thinking up to `</think>`) and follows the constraint after them.

    Bounds (every field is checked on construction; a bad value is a ValueError naming the
    field and the bound; real fields refuse NaN and +-inf before their range is checked):
    max_tokens None or >= 1; temperature finite >= 0; top_k >= -1; top_p in (0, 1];
    min_p in [0, 1]; seed an int in SEED_RANGE, [-2**63, 2**64 - 1] (-1 is stored as None,
    unseeded, as in vLLM); min_tokens in [0, max_tokens] (with max_tokens None, checked
    against the value the engine sets on add);
    n in [1, MAX_N = 256]; logprobs and prompt_logprobs None, ALL_LOGPROBS (-1) or >= 0 (and
    <= vocab_size, checked by `validate_vocab`); presence_penalty and frequency_penalty in [-2, 2];
    repetition_penalty finite > 0; logit_bias values in [-100, 100]; token ids (stop_token_ids,
    allowed_token_ids, logit_bias keys) as spec.validation.check_token_id says (any integral
    type, not bool), < vocab_size per `validate_vocab`; ignore_eos, include_stop_str_in_output,
    skip_special_tokens, spaces_between_special_tokens and detokenize bools; output_kind a
    RequestOutputKind (or its int value); stop, stop_token_ids and bad_words may be None,
    vLLM's default (stored as ()); bad_words non-empty strings (a str is one word, as
    for stop; at most
    MAX_NUM_BAD_WORDS = 128 token sequences once tokenized, vLLM's bound), bad_words_token_ids
    non-empty sequences of token ids (as many at most); truncate_prompt_tokens None, -1 or >= 1
    (<= max_model_len, checked by the engine); extra_args None or a dict. Integral fields accept
    numpy integers and store plain ints.
    """

    max_tokens: Optional[int] = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[Mapping[int, float]] = None
    allowed_token_ids: Optional[tuple[int, ...]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    truncate_prompt_tokens: Optional[int] = None
    extra_args: Optional[Mapping[str, Any]] = None
    structured_outputs: Optional[StructuredOutputsParams] = None
    # the EOS ids beside the request's (generation_config.json's, config.json's list): docstring
    further_eos_token_ids: tuple[int, ...] = ()
    best_of: InitVar[Optional[int]] = None  # refused unless None or 1 (not stored): use n
    # refused unless None or empty (not stored): no custom logits processor runs (vLLM V1 refuses
    # per-request ones too); the logit edits are the fields above
    logits_processors: InitVar[Optional[Sequence[Any]]] = None

    def __post_init__(self, best_of: Optional[int], logits_processors: Optional[Sequence[Any]]) -> None:
        _check(
            best_of is None or best_of == 1,
            "best_of",
            "None or 1 (best_of is not supported, as in vLLM V1: use n for several samples)",
            best_of,
        )
        _check(
            logits_processors is None
            or (isinstance(logits_processors, (list, tuple)) and not logits_processors),
            "logits_processors",
            "None or [] (no custom logits processor runs, as vLLM V1 runs no per-request ones: use "
            "logit_bias, allowed_token_ids, bad_words, min_tokens or structured_outputs)",
            logits_processors,
        )
        # Normalise sequences to tuples (and numbers to plain int/float) so the dataclass stays
        # immutable and every backend sees the same types.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        self._validate()

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _validate(self) -> None:
        """Every field: type, finiteness, range; ValueError naming the field and the bound."""
        self._validate_sampling()
        self._validate_stops()
        self._validate_counts()
        self._validate_biases()
        self._validate_extras()
        self._set("output_kind", _output_kind(self.output_kind))

    def _validate_sampling(self) -> None:
        real, whole = _real, _int
        self._set("temperature", real("temperature", self.temperature, 0.0, None))
        self._set("top_k", whole("top_k", self.top_k, -1, None))
        self._set("top_p", real("top_p", self.top_p, 0.0, 1.0, "in (0, 1]"))
        _check(self.top_p > 0.0, "top_p", "in (0, 1]", self.top_p)
        self._set("min_p", real("min_p", self.min_p, 0.0, 1.0))
        if self.seed is not None:
            seed = whole("seed", self.seed, *SEED_RANGE)
            self._set("seed", None if seed == UNSEEDED else seed)
        self._set("presence_penalty", real("presence_penalty", self.presence_penalty, -2.0, 2.0))
        self._set("frequency_penalty", real("frequency_penalty", self.frequency_penalty, -2.0, 2.0))
        self._set("repetition_penalty", real("repetition_penalty", self.repetition_penalty, 0.0, None, "> 0"))
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "> 0", self.repetition_penalty)

    def _validate_stops(self) -> None:
        """Stop ids and strings, and the bool flags (detokenize decides whether stop strings can
        be matched at all)."""
        for name in _FLAGS:
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))
        self._set("stop_token_ids", tuple(_ids("stop_token_ids", self.stop_token_ids or ())))
        further = self.further_eos_token_ids
        self._set("further_eos_token_ids", tuple(_ids("further_eos_token_ids", further or ())))
        stop = () if self.stop is None else self.stop  # None: vLLM's default, no stop strings
        _check(
            not isinstance(stop, (bytes, dict)) and isinstance(stop, Iterable),
            "stop",
            "None, a str or a list of non-empty strings",
            stop,
        )
        self._set("stop", tuple(stop))
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings", self.stop)
        _check(
            self.detokenize or not self.stop,
            "stop",
            "empty when detokenize=False (stop strings are matched in the detokenized text)",
            self.stop,
        )

    def _validate_counts(self) -> None:
        whole = _int
        if self.max_tokens is not None:
            self._set("max_tokens", whole("max_tokens", self.max_tokens, 1, None))
        self._set("min_tokens", whole("min_tokens", self.min_tokens, 0, None))
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"<= max_tokens ({self.max_tokens})",
            self.min_tokens,
        )
        self._set("n", whole("n", self.n, 1, MAX_N))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                k = getattr(self, name)
                k = int(k) if isinstance(k, bool) else check_int("SamplingParams", name, k)
                _check(k >= ALL_LOGPROBS, name, f"None, {ALL_LOGPROBS} (the whole vocabulary) or >= 0", k)
                self._set(name, k)

    def _validate_biases(self) -> None:
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, Mapping), "logit_bias", "a dict", self.logit_bias)
            self._set(
                "logit_bias",
                {
                    _ids("logit_bias", [k])[0]: _real("logit_bias", v, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
                    for k, v in self.logit_bias.items()
                },
            )
        if self.allowed_token_ids is not None:
            ids = tuple(_ids("allowed_token_ids", self.allowed_token_ids))
            _check(len(ids) > 0, "allowed_token_ids", "a non-empty list of non-negative ints", ids)
            self._set("allowed_token_ids", ids)

    def _validate_extras(self) -> None:
        """bad_words (and their token sequences), truncate_prompt_tokens, extra_args."""
        words = () if self.bad_words is None else self.bad_words  # None: vLLM's default, no bans
        if isinstance(words, str):
            words = (words,)
        _check(
            not isinstance(words, (bytes, dict)) and isinstance(words, Iterable),
            "bad_words",
            "None or a list of non-empty strings",
            words,
        )
        words = tuple(dict.fromkeys(words))  # vLLM drops repeats
        _check(all(isinstance(w, str) and w for w in words), "bad_words", "non-empty strings", words)
        self._set("bad_words", words)
        seqs = self.bad_words_token_ids
        _check(
            not isinstance(seqs, (str, bytes, dict)) and isinstance(seqs, Iterable),
            "bad_words_token_ids",
            "a list of token id lists",
            seqs,
        )
        seqs = tuple(dict.fromkeys(tuple(_ids("bad_words_token_ids", s)) for s in seqs))
        _check(all(seqs), "bad_words_token_ids", "non-empty token id lists", seqs)
        _check(
            len(seqs) <= MAX_NUM_BAD_WORDS,
            "bad_words_token_ids",
            f"at most {MAX_NUM_BAD_WORDS} token sequences",
            len(seqs),
        )
        self._set("bad_words_token_ids", seqs)
        if self.truncate_prompt_tokens is not None:
            k = check_int("SamplingParams", "truncate_prompt_tokens", self.truncate_prompt_tokens)
            _check(
                k >= 1 or k == TRUNCATE_TO_MAX_MODEL_LEN,
                "truncate_prompt_tokens",
                f"None, {TRUNCATE_TO_MAX_MODEL_LEN} (up to max_model_len) or >= 1",
                k,
            )
            self._set("truncate_prompt_tokens", k)
        if self.extra_args is not None:
            _check(isinstance(self.extra_args, Mapping), "extra_args", "None or a dict", self.extra_args)
            self._set("extra_args", dict(self.extra_args))
        if self.structured_outputs is not None:
            self._set("structured_outputs", StructuredOutputsParams.of(self.structured_outputs))

    def with_bad_words_tokens(self, tokenizer) -> "SamplingParams":
        """These params with bad_words tokenized into bad_words_token_ids (after those given),
        vLLM's way (`SamplingParams.update_from_tokenizer`): each word with its leading spaces
        stripped, then " " + that, which counts only where it gives as many tokens as the first
        with another first token (a tokenizer that marks a word's start in its first token);
        `tokenizer.encode(text, add_special_tokens=False)`. self when bad_words is empty. A
        word that gives no token, or more than MAX_NUM_BAD_WORDS sequences in all, is a
        ValueError naming bad_words."""
        if not self.bad_words:
            return self
        seqs = list(self.bad_words_token_ids)
        for word in self.bad_words:
            plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
            _check(bool(plain), "bad_words", "words that give at least one token", word)
            spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            seqs.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                seqs.append(spaced)
            _check(
                len(seqs) <= MAX_NUM_BAD_WORDS,
                "bad_words",
                f"at most {MAX_NUM_BAD_WORDS} token sequences once tokenized",
                self.bad_words,
            )
        return dataclasses.replace(self, bad_words_token_ids=tuple(seqs))

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax (temperature 0)."""
        return self.temperature == 0.0

    def validate_vocab(self, vocab_size: int) -> None:
        """Check token ids, logprobs and prompt_logprobs against the model's vocabulary (the
        engine calls this on add; a k above the vocabulary is refused, never clamped)."""
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("further_eos_token_ids", self.further_eos_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("logit_bias", tuple(self.logit_bias or ())),
            ("bad_words_token_ids", tuple(t for s in self.bad_words_token_ids for t in s)),
            (
                "structured_outputs.start_after_token_ids",
                (self.structured_outputs and self.structured_outputs.start_after_token_ids) or (),
            ),
        ):
            bad = [t for t in ids if t >= vocab_size]
            _check(not bad, name, f"token ids < vocab_size ({vocab_size})", bad)
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            _check(k is None or k <= vocab_size, name, f"<= vocab_size ({vocab_size})", k)

    def validate_logprobs_cap(self, max_logprobs: int) -> None:
        """logprobs and prompt_logprobs (ALL_LOGPROBS resolved by with_vocab first) within the
        engine's max_logprobs (-1 already read as the vocabulary size), in vLLM's words; the
        message starts with the field's name, as the server's 400 reads its param from it. The
        engine checks it on add, and the server's front end before its queue's 503 (a request
        over the cap is the client's error however busy the server is)."""
        for name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            k = getattr(self, name)
            if k is not None and k > max_logprobs:
                raise ValueError(
                    f"SamplingParams.{name}: requested {kind} logprobs of {k}, which is greater than "
                    f"max allowed: {max_logprobs} (the engine's max_logprobs, --max-logprobs; -1 lifts the cap)"
                )

    def with_vocab(self, vocab_size: int) -> "SamplingParams":
        """These params with logprobs / prompt_logprobs of ALL_LOGPROBS (-1) set to vocab_size
        (the engine calls this on add); self when neither is -1."""
        if ALL_LOGPROBS not in (self.logprobs, self.prompt_logprobs):
            return self
        return dataclasses.replace(
            self,
            logprobs=vocab_size if self.logprobs == ALL_LOGPROBS else self.logprobs,
            prompt_logprobs=vocab_size if self.prompt_logprobs == ALL_LOGPROBS else self.prompt_logprobs,
        )


def _refuse_assignment(self: SamplingParams, name: str, value: object) -> None:
    """SamplingParams' __setattr__: frozen, as the dataclass made it, with an error a port of
    vLLM's code can act on (vLLM's SamplingParams is mutable, and its generate example sets
    max_tokens and temperature on llm.get_default_sampling_params())."""
    raise dataclasses.FrozenInstanceError(
        _frozen_message(name, f"dataclasses.replace(params, {name}={value!r})")
    )


def _refuse_deletion(self: SamplingParams, name: str) -> None:
    raise dataclasses.FrozenInstanceError(_frozen_message(name, "dataclasses.replace(params, ...)"))


def _frozen_message(name: str, replace: str) -> str:
    if name not in SamplingParams.__dataclass_fields__:
        return f"SamplingParams.{name} is not a field of SamplingParams (which is frozen besides)"
    return (
        f"SamplingParams.{name} cannot be assigned: SamplingParams is frozen (validated once on "
        f"construction and shared by the engine, unlike vLLM's); make a changed copy, checked as "
        f"a new one is: params = {replace}"
    )


# Set after the class is made: dataclass(frozen=True) refuses a class that defines them itself.
SamplingParams.__setattr__ = _refuse_assignment  # type: ignore[method-assign,assignment]
SamplingParams.__delattr__ = _refuse_deletion  # type: ignore[method-assign,assignment]
