"""vLLM's prompt types (`vllm.inputs`): the dict prompts LLM.generate, LLM.beam_search and
AsyncLLM.generate take, as TypedDicts for type checkers. At run time they are plain dicts, so
`TokensPrompt(prompt_token_ids=[1, 2])` is `{"prompt_token_ids": [1, 2]}`.

Keys (llm.prompt_to_ids reads them; any other key is a ValueError naming the allowed ones):
- TextPrompt: "prompt", the text, encoded with the tokenizer's special tokens;
- TokensPrompt: "prompt_token_ids", used as given;
- either: "cache_salt", a str that becomes the request's prefix-cache key, so requests of
  different salts never share cached blocks.
vLLM's multi-modal keys (multi_modal_data, mm_processor_kwargs) and token_type_ids are not
taken: this engine runs text-only decoders.
"""

from __future__ import annotations

from typing import Sequence, TypedDict, Union


class _Salted(TypedDict, total=False):
    cache_salt: str


class TextPrompt(_Salted):
    """A prompt given as text."""

    prompt: str


class TokensPrompt(_Salted):
    """A prompt given as token ids."""

    prompt_token_ids: list[int]


#: One prompt: text, token ids, or one of the dicts above.
PromptType = Union[str, TextPrompt, TokensPrompt, dict, Sequence[int]]

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
