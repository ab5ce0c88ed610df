"""What the tensor-parallel test modules share: the prompts, the greedy run and the reference
checks (test_tensor_parallel.py, test_tensor_parallel_parity.py)."""

from __future__ import annotations

import torch

from enginespec import SamplingParams
from enginespec.conformance.test_parity import TIE_TOLERANCE

MAX_TOKENS = 6
# A shared 4-token stem (prefix-cache hits at block_size 2) and distinct tails.
PROMPTS = [(5, 9, 14, 20) + tuple(range(30 + 7 * i, 32 + 7 * i)) for i in range(3)]
PROMPTS.append((60, 61, 62, 63, 64, 65))


def _processes_alive(llm) -> list:
    return [p for p in llm.engine.tensor_parallel.processes if p.exitcode is None]


def _generate(llm) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _transformers_greedy(path, prompt) -> tuple[list[int], torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=MAX_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()


def _assert_same_up_to_tie(got: list[int], want: list[int], logits: torch.Tensor, what: str) -> None:
    """got == want, except that at a near-tie of the reference's logits (TIE_TOLERANCE, the
    conformance suite's rule) either token may come first; the continuations then differ."""
    for t, (a, b) in enumerate(zip(got, want)):
        if a != b:
            margin = abs(float(logits[t, a] - logits[t, b]))
            assert margin <= TIE_TOLERANCE, f"{what}: token {t} is {a}, expected {b} (margin {margin:.3g})"
            return
    assert len(got) == len(want) == MAX_TOKENS, what
