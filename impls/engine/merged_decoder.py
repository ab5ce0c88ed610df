"""MergedDecoder: a Llama-family decoder with merged projections, over the checkpoint's own modules.

Why it exists: transformers' decoder layers compute q, k and v with three GEMMs and the MLP's
gate and up with two more. At a decode step the token count N is small (1-256 rows), so each
GEMM is a short, launch-bound kernel: on an H200 the seven projection GEMMs of a Qwen3-0.6B
layer took ~39 us at 256 rows against ~10 us of weight reads, and kernel count set the batch-1
latency. Here each layer runs two GEMMs where transformers runs five (one for q|k|v, one for
gate|up), on flat [N, ...] rows with no batch dimension or transposes around attention.

What is ours and what is not: only the wiring of a decoder layer (the order of the calls that
Qwen3/Qwen2/Llama/Mistral's DecoderLayer, Attention and MLP forwards make) is written here.
Every numeric building block is still the checkpoint's own transformers module or function: the
embedding, the rotary embedding (any rope scaling), the RMSNorms (Qwen3's per-head q/k norms
included), the activation, `apply_rotary_pos_emb` of the model's own modeling module, o_proj,
down_proj and the head. The merged weights are the concatenation of the loaded ones, and the
original Linear modules keep working: their weights become row slices (views) of the merged
tensors, so no weight is held twice and `model_impl="transformers"` still runs the same model.

Invariant (tested against transformers family by family, conformance/test_flat_model.py): the
merged decoder computes what transformers' decoder computes over the same rows, up to the
floating-point reassociation of one GEMM instead of several.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

# transformers model_type values whose decoder layers MergedDecoder reproduces.
MERGEABLE_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


def merge_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Concatenate the weights (and biases) of linears sharing one input, row-wise, and rebind
    each linear's parameters to its slice of the result. Returns (weight [sum out, in], bias or
    None). All or none of the linears must have a bias."""
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("merge_linears: either every linear has a bias or none does")
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears]) if all(has_bias) else None
    start = 0
    for lin in linears:
        stop = start + lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start:stop], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:stop], requires_grad=False)
        start = stop
    return weight, bias


def layer_window(attn: nn.Module, passed: Optional[int]) -> int:
    """The sliding window of one attention module (0 = full): the module's own setting first
    (Qwen2/3 set it per layer type), else what the model passes it (Mistral: config.sliding_window
    for every layer; Llama: nothing)."""
    window = attn.sliding_window if hasattr(attn, "sliding_window") else passed
    return int(window) if window else 0


class MergedLayer(nn.Module):
    """One decoder layer: hidden [N, hidden] -> [N, hidden] (attention through the paged op)."""

    def __init__(self, hf_layer: nn.Module, layer_idx: int, config):
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.layer_idx = layer_idx
        self.head_dim = int(attn.head_dim)
        self.num_q = int(attn.q_proj.weight.shape[0]) // self.head_dim
        self.num_kv = int(attn.k_proj.weight.shape[0]) // self.head_dim
        self.scale = float(attn.scaling)
        self.window = layer_window(attn, getattr(config, "sliding_window", None))
        self.input_layernorm = hf_layer.input_layernorm
        self.post_attention_layernorm = hf_layer.post_attention_layernorm
        self.q_norm = getattr(attn, "q_norm", None)   # Qwen3: RMSNorm over head_dim
        self.k_norm = getattr(attn, "k_norm", None)
        self.o_proj, self.down_proj, self.act_fn = attn.o_proj, mlp.down_proj, mlp.act_fn
        self.rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        qkv_w, qkv_b = merge_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up_w, gate_up_b = merge_linears([mlp.gate_proj, mlp.up_proj])
        self.qkv_weight = nn.Parameter(qkv_w, requires_grad=False)          # [(Hq + 2 Hkv) D, hidden]
        self.qkv_bias = None if qkv_b is None else nn.Parameter(qkv_b, requires_grad=False)
        self.gate_up_weight = nn.Parameter(gate_up_w, requires_grad=False)  # [2 I, hidden]
        self.gate_up_bias = None if gate_up_b is None else nn.Parameter(gate_up_b, requires_grad=False)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] (normed) -> o_proj output [N, hidden]."""
        n, d = x.shape[0], self.head_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)                  # [N, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.num_q * d, self.num_kv * d, self.num_kv * d], dim=-1)
        q, k, v = q.view(n, self.num_q, d), k.view(n, self.num_kv, d), v.view(n, self.num_kv, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotate(q, k, cos, sin, unsqueeze_dim=1)               # cos/sin [N, D]
        out = torch.ops.enginespec.paged_attention(q, k, v, self.layer_idx, self.scale, self.window)
        return self.o_proj(out.reshape(n, self.num_q * d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attention(self.input_layernorm(hidden), cos, sin)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class MergedDecoder(nn.Module):
    """input_ids, positions [N] -> final-norm hidden [N, hidden], built over a transformers
    decoder (`model.model`) whose modules and weights it shares."""

    def __init__(self, hf_decoder: nn.Module, config):
        super().__init__()
        self.embed_tokens = hf_decoder.embed_tokens
        self.rotary_emb = hf_decoder.rotary_emb
        self.norm = hf_decoder.norm
        num_layers = int(config.num_hidden_layers)
        self.layers = nn.ModuleList(MergedLayer(layer, i, config)
                                    for i, layer in enumerate(hf_decoder.layers[:num_layers]))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)                              # [N, hidden]
        cos, sin = self.rotary_emb(hidden, positions[None])                # [1, N, D] each
        cos, sin = cos[0], sin[0]
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)


def can_merge(config) -> bool:
    """Whether MergedDecoder reproduces this config's decoder layers."""
    return getattr(config, "model_type", None) in MERGEABLE_MODEL_TYPES
