"""FlatModel: a transformers decoder run on one flat batch, attention through a paged backend.

Nothing the checkpoint's own modules compute is re-implemented: embeddings, rotary embeddings
(llama3 scaling included), norms, projections (Qwen2's qkv bias, Qwen3's q/k norms) and MLPs
are transformers' modules with our loaded weights. Only the attention kernel is replaced: we
register an attention function under the name "enginespec" in transformers' AttentionInterface
and point the config at it. transformers then builds no mask for it (an implementation without
a mask function gets None) and calls it per layer with q/k/v of shape [1, heads, N, head_dim];
it calls the custom op `enginespec::paged_attention` (step_context.py), which writes this
step's K/V into the layer's pool at the batch's slots and runs backend.forward.

The whole flat batch is one "sequence" of N rows (input_ids [1, N], position_ids [1, N]): rows
of different requests never see each other because the backend attends through each request's
block table, not over the N rows. The batch metadata and pools travel in the StepContext that
forward() activates around the decoder, so the module tree holds no per-step state and `body`
(the decoder alone, tensors in and out) can be compiled by a caller; nothing here knows about
compilation or CUDA graphs.
"""
from __future__ import annotations

from typing import Optional

import torch

from spec import AttentionBackend, BatchMeta

from .loader import build_model
from .step_context import StepContext, active

ATTN_NAME = "enginespec"


def _window_of(module, sliding_window) -> int:
    """The layer's sliding window (0 = full attention): the module's own setting first (Qwen2/3
    set it per layer type), else what the model passed (Mistral passes config.sliding_window)."""
    window = module.sliding_window if hasattr(module, "sliding_window") else sliding_window
    return int(window) if window else 0


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    sliding_window=None, **kwargs):
    """transformers attention function: q [1, Hq, N, D], k/v [1, Hkv, N, D] -> ([1, N, Hq, D], None)."""
    if query.shape[0] != 1:
        raise ValueError(f"{ATTN_NAME}: the flat batch is one row of N tokens, got batch {query.shape[0]}")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = torch.ops.enginespec.paged_attention(query, key, value, module.layer_idx, scale,
                                               _window_of(module, sliding_window))
    return out, None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class FlatModel:
    """A causal LM over flat batches. Attributes describe the KV pool shape the runner allocates."""

    def __init__(self, hf_model, attention: AttentionBackend):
        _register_attention()
        self.hf_model = hf_model
        self.config = hf_model.config
        self.config._attn_implementation = ATTN_NAME
        text = _text_config(self.config)
        self.num_layers = int(text.num_hidden_layers)
        self.num_q_heads = int(text.num_attention_heads)
        self.num_kv_heads = int(getattr(text, "num_key_value_heads", None) or self.num_q_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // self.num_q_heads)
        self.hidden_size = int(text.hidden_size)
        self.vocab_size = int(text.vocab_size)
        self.max_position_embeddings = int(text.max_position_embeddings)
        self.eos_token_id = self._eos_token_id(text)
        param = next(hf_model.parameters())
        self.dtype = param.dtype
        self.device = param.device
        self.attention = attention
        self._decoder = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else hf_model.model

    @staticmethod
    def _eos_token_id(config) -> Optional[int]:
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    @classmethod
    def from_pretrained(cls, path, *, dtype: torch.dtype = torch.float32, device="cpu",
                        attention: AttentionBackend) -> "FlatModel":
        """Load a local checkpoint directory with our loader onto `device` in `dtype`."""
        return cls(build_model(path, device=device, dtype=dtype), attention)

    def allocate_kv(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """One pool per layer, [2, num_blocks + 1, block_size, kv_heads, head_dim] (+1 = scratch)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"allocate_kv: num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        shape = (num_blocks + 1, block_size, self.num_kv_heads, self.head_dim)
        return [self.attention.allocate(shape, self.dtype, self.device) for _ in range(self.num_layers)]

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: BatchMeta,
                kv_caches: list[torch.Tensor], body=None) -> torch.Tensor:
        """input_ids, positions [N] -> final-norm hidden states [N, hidden]; writes this step's
        K/V into `kv_caches` at meta.slot_mapping. `body` replaces self.body (a compiled copy of
        it, say: the caller decides; the model does not know)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"forward: input_ids and positions must both be [N], got "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"forward: need one kv cache per layer ({self.num_layers}), got {len(kv_caches)}")
        with active(StepContext(meta=meta, kv_caches=kv_caches, backend=self.attention)):
            return (body or self.body)(input_ids, positions)

    def body(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The decoder alone: input_ids, positions [N] -> hidden [N, hidden]. Tensors in and out,
        no per-step state: this is what a caller may compile (attention finds the batch in the
        active StepContext)."""
        out = self._decoder(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    __call__ = forward

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] -> float32 logits [S, V] through the checkpoint's own head."""
        return self.hf_model.get_output_embeddings()(hidden).float()
