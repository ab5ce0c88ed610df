"""The checkpoint's generation_config.json: its EOS ids and its sampling defaults, as vLLM reads
them (its default `--generation-config auto`).

- EOS ids: generation_config.json may list more end-of-sequence ids than config.json (Llama 3
  Instruct's `<|eot_id|>`, Qwen's `<|endoftext|>` beside `<|im_end|>`). The request's EOS is
  the tokenizer's `eos_token_id` (the one vLLM gives every request; the model's without a
  tokenizer); every other id of either file, the model's own included, stops a request as a
  stop token (stop_reason: its id, as vLLM's), unless it asks `ignore_eos`.
- Sampling defaults: the file's temperature, top_p, top_k, min_p and repetition_penalty, where
  they differ from transformers' GenerationConfig defaults (vLLM applies the file's diff against
  those defaults, so a stated `top_k: 50` changes nothing there and nothing here), and
  max_new_tokens as max_tokens. They apply only where the user did not choose: SamplingParams
  built by `default_sampling_params()` (LLM.generate without params), and an OpenAI request's
  unset fields. A SamplingParams the user built is never changed.

Which file, and overrides (vLLM's `generation_config` and `override_generation_config` engine
arguments, `GenerationDefaults.load`): "auto" (the default) reads the model directory's file;
"vllm" keeps its EOS ids but none of its sampling defaults (vLLM's neutral ones); a directory
reads that directory's file for both. `override_generation_config` (a dict of the file's keys:
temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens) then sets sampling
defaults over any of them, as given (a value equal to transformers' default included); a key
outside those is ignored with a warning, as vLLM takes only those, and a value the spec refuses
is a ValueError naming it (the user wrote it, not a checkpoint).

Invariant: a missing, unreadable or non-object file means no defaults and no further EOS ids
(the engine behaves as it did without the file), and a value the spec would refuse (a
temperature below 0, say) is dropped with a warning rather than failing every request.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from enginespec.spec import SamplingParams

log = logging.getLogger(__name__)

FILE_NAME = "generation_config.json"
# transformers' GenerationConfig defaults: a field equal to its default is not a choice
_HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None, "repetition_penalty": 1.0}
_RENAMED = {"max_new_tokens": "max_tokens"}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint's generation_config.json asks for (empty when it has none)."""

    eos_token_ids: tuple[int, ...] = ()  # every EOS id the file lists, in its order
    sampling: dict = field(default_factory=dict)  # SamplingParams field -> value

    @classmethod
    def from_dir(cls, path: Union[str, Path, None]) -> "GenerationDefaults":
        raw = _read(path)
        return cls(_ids(raw.get("eos_token_id")), _sampling(raw))

    @classmethod
    def load(
        cls, model_dir: Union[str, Path, None], generation_config="auto", override: Optional[dict] = None
    ) -> "GenerationDefaults":
        """The defaults an engine over `model_dir` uses under vLLM's generation_config ("auto",
        "vllm" or a directory) and override_generation_config (see the module docstring)."""
        if generation_config in ("auto", "vllm"):
            got = cls.from_dir(model_dir)
        elif isinstance(generation_config, (str, Path)) and Path(generation_config).is_dir():
            got = cls.from_dir(generation_config)
        else:
            raise ValueError(
                f"generation_config must be 'auto', 'vllm' or a directory (holding a {FILE_NAME}), "
                f"got {generation_config!r}"
            )
        sampling = {} if generation_config == "vllm" else dict(got.sampling)
        sampling.update(_overrides(override))
        return cls(got.eos_token_ids, sampling)

    def params(self, base: Optional[SamplingParams] = None) -> SamplingParams:
        """`base` (default: SamplingParams()) with the file's sampling defaults applied."""
        base = SamplingParams() if base is None else base
        return dataclasses.replace(base, **self.sampling) if self.sampling else base


def further_eos_ids(eos: Optional[int], *lists) -> tuple[int, ...]:
    """The ids of `lists` (each an int, a list of ints or None) other than `eos`, each once."""
    out: list[int] = []
    for ids in lists:
        out += [t for t in _ids(ids) if t != eos and t not in out]
    return tuple(out)


def _read(path) -> dict:
    if path is None:
        return {}
    file = Path(path) / FILE_NAME
    if not file.is_file():
        return {}
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", file, exc)
        return {}
    return raw if isinstance(raw, dict) else {}


def _ids(value) -> tuple[int, ...]:
    if value is None or isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(int(t) for t in value if isinstance(t, int) and not isinstance(t, bool))
    return ()


def _sampling(raw: dict) -> dict:
    """The file's sampling fields that differ from transformers' defaults and that
    SamplingParams accepts, renamed to SamplingParams' names."""
    chosen = {}
    for key in (*_HF_DEFAULTS, *_RENAMED):
        if key not in raw or raw[key] is None or raw[key] == _HF_DEFAULTS.get(key):
            continue
        name = _RENAMED.get(key, key)
        try:
            SamplingParams(**{name: raw[key]})
        except (TypeError, ValueError) as exc:
            log.warning("ignoring %s's %s: %s", FILE_NAME, key, exc)
            continue
        chosen[name] = raw[key]
    return chosen


def _overrides(override: Optional[dict]) -> dict:
    """override_generation_config's sampling fields under SamplingParams' names, each checked."""
    if override is None:
        return {}
    if not isinstance(override, dict):
        raise ValueError(f"override_generation_config must be None or a dict, got {override!r}")
    chosen = {}
    for key, value in override.items():
        if key not in _HF_DEFAULTS and key not in _RENAMED:
            log.warning(
                "override_generation_config: ignoring %r (sampling keys: %s)", key, [*_HF_DEFAULTS, *_RENAMED]
            )
            continue
        if value is None:
            continue
        name = _RENAMED.get(key, key)
        try:
            SamplingParams(**{name: value})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"override_generation_config[{key!r}]: {exc}") from exc
        chosen[name] = value
    return chosen
