"""LLM: the offline API, shaped like vLLM's so its users feel at home.

    llm = LLM("/path/to/checkpoint", max_num_seqs=8)  # impl="fast" by default
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8))
    outs[0].outputs[0].text

Engine arguments are vLLM's EngineArgs names plus ours (see engine_args.EngineArgs); an unknown
name is a TypeError naming it. generate() adds every prompt first (all or nothing: a bad prompt
aborts the ones this call already added and re-raises), then steps the engine until they are
all finished, and returns them in prompt order.
"""

from __future__ import annotations

import itertools
import time
from typing import Iterator, Optional, Sequence, Union

from tqdm.auto import tqdm

from enginespec.engine.engine_core import EngineCore
from enginespec.engine_args import EngineArgs
from enginespec.outputs import RequestOutput
from enginespec.spec import SamplingParams

PromptType = Union[str, dict, Sequence[int]]


class LLM:
    """An engine plus a tokenizer, driven to completion per call."""

    def __init__(self, model, impl="fast", **engine_args):
        args = EngineArgs.from_kwargs(model, impl=impl, **engine_args)
        self.engine = EngineCore(args)
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: EngineCore) -> "LLM":
        """Wrap an existing EngineCore (for example one built over an already loaded model)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._ids = itertools.count()
        return llm

    def get_tokenizer(self):
        return self.engine.tokenizer

    # ---- adding -------------------------------------------------------------------------------

    def _to_ids(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        """(prompt text or None, token ids) of one prompt."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self._to_ids(prompt["prompt"])
            raise ValueError(f"a dict prompt needs 'prompt_token_ids' or 'prompt', got keys {sorted(prompt)}")
        if isinstance(prompt, str):
            tokenizer = self.engine.tokenizer
            if tokenizer is None:
                raise ValueError(
                    "text prompts need a tokenizer; this checkpoint has none "
                    "(pass {'prompt_token_ids': [...]})"
                )
            return prompt, list(tokenizer.encode(prompt))
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(
            f"a prompt must be a str, a list of token ids or a dict with 'prompt_token_ids', "
            f"got {type(prompt).__name__}"
        )

    def _add(self, prompts, sampling_params, priority) -> list[str]:
        """Add every prompt; on any error abort the ones added here and re-raise."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        params = _per_prompt(sampling_params, len(prompts), "sampling_params")
        priorities = _per_prompt(priority if priority is not None else 0, len(prompts), "priority")
        added: list[str] = []
        try:
            for prompt, p, prio in zip(prompts, params, priorities):
                text, ids = self._to_ids(prompt)
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, ids, p, prompt=text, priority=prio)
                added.append(request_id)
        except Exception:
            self.engine.abort(added, report=False)
            raise
        return added

    # ---- running ------------------------------------------------------------------------------

    def generate(
        self,
        prompts,
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        priority: Union[int, Sequence[int], None] = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns the final RequestOutputs in prompt order."""
        ids = self._add(prompts, sampling_params, priority)
        finals: dict[str, RequestOutput] = {}
        bar = tqdm(
            total=len(ids), desc="Processed prompts", unit="req", disable=not use_tqdm, dynamic_ncols=True
        )
        start, num_out = time.perf_counter(), 0
        try:
            for step_outputs in self._run(ids, final_only=True):
                for out in step_outputs:
                    if out.finished:
                        finals[out.request_id] = out
                        num_out += out.num_output_tokens
                        bar.update(1)
                elapsed = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"output {num_out / elapsed:.1f} tok/s", refresh=False)
        finally:
            bar.close()
        return [finals[i] for i in ids]

    def stream(
        self, prompts, sampling_params=None, priority: Union[int, Sequence[int], None] = None
    ) -> Iterator[list[RequestOutput]]:
        """Yield, after every engine step, the (cumulative) outputs of this call's requests that
        changed in it. Closing the generator early aborts the requests still running."""
        ids = self._add(prompts, sampling_params, priority)
        yield from self._run(ids)

    def _run(self, ids: list[str], final_only: bool = False) -> Iterator[list[RequestOutput]]:
        wanted = set(ids)
        live = set(ids)
        try:
            while live:
                if not self.engine.has_unfinished:
                    raise RuntimeError(f"engine went idle with requests {sorted(live)} unfinished (a bug)")
                outs = [o for o in self.engine.step(final_only) if o.request_id in wanted]
                live -= {o.request_id for o in outs if o.finished}
                if outs:
                    yield outs
        finally:
            if live:
                self.engine.abort(sorted(live), report=False)

    def chat(
        self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or to a
        list of conversations, rendered with the tokenizer's chat template."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat() needs a tokenizer with a chat template; this checkpoint has none")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            prompts.append(
                {"prompt": text, "prompt_token_ids": list(tokenizer.encode(text, add_special_tokens=False))}
            )
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _per_prompt(value, count: int, name: str) -> list:
    """One value per prompt: a single value is repeated, a list must have one per prompt."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: got {len(value)} values for {count} prompts")
        return list(value)
    return [value] * count
