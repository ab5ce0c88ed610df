"""FlatModel: a transformers checkpoint run on one flat batch, attention through a paged backend.

The whole flat batch is N rows of tokens (input_ids, positions [N]): rows of different
requests never see each other because the backend attends through each request's block table,
not over the N rows. The batch metadata and pools travel in the StepContext that forward()
activates around the decoder, so the module tree holds no per-step state and `body` (the
decoder alone, tensors in and out) can be compiled by a caller; nothing here knows about
compilation or CUDA graphs.

Two decoders over the same loaded modules and weights (`model_impl`):
- "merged" (the default for every supported family): merged_decoder.py, our wiring of the
  checkpoint's own modules with q|k|v and gate|up each computed by one GEMM.
- "transformers": transformers' own decoder forward. We register an attention function under
  the name "enginespec" in transformers' AttentionInterface and point the config at it;
  transformers then builds no mask for it (an implementation without a mask function gets None)
  and calls it per layer with q/k/v of shape [1, heads, N, head_dim] (the flat batch is one
  "sequence" of N rows).
Both reach attention through the custom op `enginespec::paged_attention` (step_context.py),
which writes this step's K/V into the layer's pool at the batch's slots and runs
backend.forward.
"""

from __future__ import annotations

from typing import Optional

import torch

from enginespec.engine_args import MODEL_IMPLS
from enginespec.spec import AttentionBackend, BatchMeta
from enginespec.worker.loader import build_model
from enginespec.worker.merged_decoder import (
    STATIC_ROPE_TYPES,
    MergedDecoder,
    PerRequestRope,
    can_merge,
    layer_window,
    max_positions,
)
from enginespec.worker.step_context import StepContext, active

ATTN_NAME = "enginespec"


def paged_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    """transformers attention function: q [1, Hq, N, D], k/v [1, Hkv, N, D] -> ([1, N, Hq, D], None)."""
    if query.shape[0] != 1:
        raise ValueError(f"{ATTN_NAME}: the flat batch is one row of N tokens, got batch {query.shape[0]}")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = torch.ops.enginespec.paged_attention(
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        module.layer_idx,
        scale,
        layer_window(module, sliding_window),
    )
    return out.unsqueeze(0), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class FlatModel:
    """A causal LM over flat batches. Attributes describe the KV pool shape the runner allocates."""

    def __init__(self, hf_model, attention: AttentionBackend, model_impl: str = "auto"):
        _register_attention()
        self.hf_model = hf_model
        self._output_head = None  # compute_logits' head module, looked up at its first call
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
        self.max_positions = max_positions(text)  # the bound of max_model_len (rope scaling included)
        self.eos_token_id = self._eos_token_id(text)
        param = next(hf_model.parameters())
        self.dtype = param.dtype
        self.device = param.device
        self.attention = attention
        self._decoder = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else hf_model.model
        self.rope_per_request = self._rope_per_request(self._decoder)
        self.model_impl = self._resolve_model_impl(model_impl, text)
        fuse = callable(getattr(attention, "write_qkv", None))
        self._merged = (
            MergedDecoder(self._decoder, text, fuse_qkv_rope=fuse) if self.model_impl == "merged" else None
        )
        # Folded projections a weight update left raw, folded before the next forward
        # (worker/weight_update.py's finish_update): name -> (rows, norm weight).
        self.unfolded_rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # The norms fold into the projections where the backend applies their row scales.
        self.folded_norms = bool(
            self._merged is not None
            and getattr(attention, "folds_norms", False)
            and self._merged.fold_norms()
        )

    @property
    def merged(self) -> Optional[MergedDecoder]:
        """The merged decoder (model_impl "merged"), or None for transformers' own."""
        return self._merged

    def cover_positions(self, num_positions: int) -> None:
        """Serve positions [0, num_positions), past max_positions where the engine allowed a
        longer max_model_len (VLLM_ALLOW_LONG_MAX_MODEL_LEN): the merged decoder's cos/sin
        table grows to cover them (MergedDecoder.cover_positions); transformers' own rotary
        module computes any position per step."""
        if self._merged is not None:
            self._merged.cover_positions(num_positions)

    @staticmethod
    def _rope_per_request(decoder) -> bool:
        """Whether the decoder's rope is not a function of the position alone (dynamic NTK,
        longrope): then its module is wrapped in PerRequestRope (once), so each request's cos/sin
        come from its own rows whichever decoder runs, and the step must run eagerly (no CUDA
        graph: the segments are the step's host ints)."""
        rotary = getattr(decoder, "rotary_emb", None)
        if rotary is None:
            return False
        if isinstance(rotary, PerRequestRope):
            return True
        if getattr(rotary, "rope_type", "default") in STATIC_ROPE_TYPES:
            return False
        decoder.rotary_emb = PerRequestRope(rotary)
        return True

    @staticmethod
    def _resolve_model_impl(model_impl: str, text_config) -> str:
        if model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {list(MODEL_IMPLS)}, got {model_impl!r}")
        mergeable = can_merge(text_config)
        if model_impl == "merged" and not mergeable:
            raise ValueError(
                f"model_impl='merged' does not support model_type "
                f"{getattr(text_config, 'model_type', None)!r}; use 'transformers'"
            )
        if model_impl == "auto":
            return "merged" if mergeable else "transformers"
        return model_impl

    @staticmethod
    def _eos_token_id(config) -> Optional[int]:
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        dtype: torch.dtype = torch.float32,
        device="cpu",
        attention: AttentionBackend,
        model_impl: str = "auto",
        trust_remote_code: bool = False,
        hf_overrides: Optional[dict] = None,
    ) -> "FlatModel":
        """Load a local checkpoint directory with our loader onto `device` in `dtype`
        (trust_remote_code: for its config only; hf_overrides: merged over its config.json;
        loader.py)."""
        model = build_model(
            path, device=device, dtype=dtype, trust_remote_code=trust_remote_code, hf_overrides=hf_overrides
        )
        return cls(model, attention, model_impl)

    def allocate_kv(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """One pool per layer, [2, num_blocks + 1, block_size, kv_heads, head_dim] (+1 = scratch)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"allocate_kv: num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}"
            )
        shape = (num_blocks + 1, block_size, self.num_kv_heads, self.head_dim)
        return [self.attention.allocate(shape, self.dtype, self.device) for _ in range(self.num_layers)]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: BatchMeta,
        kv_caches: list[torch.Tensor],
        body=None,
    ) -> torch.Tensor:
        """input_ids, positions [N] -> final-norm hidden states [N, hidden]; writes this step's
        K/V into `kv_caches` at meta.slot_mapping. `body` replaces self.body (a compiled copy of
        it, say: the caller decides; the model does not know)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"forward: input_ids and positions must both be [N], got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        if len(kv_caches) != self.num_layers:
            raise ValueError(
                f"forward: need one kv cache per layer ({self.num_layers}), got {len(kv_caches)}"
            )
        with active(StepContext(meta=meta, kv_caches=kv_caches, backend=self.attention)):
            return (body or self.body)(input_ids, positions)

    def body(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The decoder alone: input_ids, positions [N] -> hidden [N, hidden]. Tensors in and out,
        no per-step state: this is what a caller may compile (attention finds the batch in the
        active StepContext)."""
        if self._merged is not None:
            return self._merged(input_ids, positions)
        out = self._decoder(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    __call__ = forward

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] -> logits [S, V] in the model's dtype, through the checkpoint's own
        head. Not upcast here: greedy argmax needs no float32 copy (the upcast changes no value),
        and the sampler upcasts where it computes. The head module is looked up once (modules
        are swapped, by tensor parallelism, before a FlatModel wraps the model), and no grad
        mode is entered where the caller's (the runner's inference mode) already has none:
        both cost host time at every decode step."""
        head = self._output_head
        if head is None:
            head = self._output_head = self.hf_model.get_output_embeddings()
        if torch.is_grad_enabled():
            with torch.no_grad():
                return head(hidden)
        return head(hidden)
