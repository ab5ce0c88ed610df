"""MergedDecoder: a Llama-family decoder with merged projections, over the checkpoint's own modules.

Why it exists: transformers' decoder layers compute q, k and v with three GEMMs and the MLP's
gate and up with two more. At a decode step the token count N is small (1-256 rows), so each
GEMM is a short, launch-bound kernel: on an H200 the seven projection GEMMs of a Qwen3-0.6B
layer took ~39 us at 256 rows against ~10 us of weight reads, and kernel count set the batch-1
latency. Here each layer runs two GEMMs where transformers runs five (one for q|k|v, one for
gate|up), on flat [N, ...] rows with no batch dimension or transposes around attention.
Measured on the H200 (benchmarks/RESULTS.md): the end-to-end run went from 1.70x to 1.55x its
roofline floor and batch-1 decode from 2.07 to 1.51 ms with this change alone (3849be6).

What is ours and what is not: the wiring of a decoder layer (the order of the calls that
Qwen3/Qwen2/Llama/Mistral's DecoderLayer, Attention and MLP forwards make), plus two four-line
helpers that let q and k go through one fused kernel: `rms_norm` (Qwen3's q_norm and k_norm as
one op over q|k, with their weights stacked per head) and `rotate_neox` (the rotate-half rotary
every supported family uses). Tests hold both to exact equality with the family's own modules
and `apply_rotary_pos_emb`. Everything else is the checkpoint's own transformers module: the
embedding, the rotary embedding module (any rope scaling; its cos/sin are tabled per position
for static rope types), the input and post-attention RMSNorms, the activation, o_proj,
down_proj, the final norm and the head. The merged weights are the concatenation of the loaded
ones, and the original Linear modules keep working: their weights become row slices (views) of
the merged tensors, so no weight is held twice and `model_impl="transformers"` still runs the
same model.

The projections run through `MergedLayer.linear` (F.linear unless the runner's skinny_gemm
option points it at a measured cuBLAS-or-Triton choice, worker/skinny_linear.py); with that
option a step of few rows may run each layer as four fused calls (`fused_calls`: the RMSNorms,
SiLU * up and the residual adds inside the GEMM launches), computed from the same modules'
weights and epsilons with transformers' rounding order.

With `fold_norms` (MergedDecoder.fold_norms: on CUDA where the backend `folds_norms`, never in
float16) each RMSNorm's weight g is folded into the projection after it (x g W^T =
x (W diag g)^T) and the norm modules' weights become 1, so every path still computes the same
function; steps that do not take the fused calls then run each layer without a norm launch
(`_forward_folded`): the norm's row scale is applied by the kernels after the GEMMs
(kernels/row_scale.py) and the residual adds run inside the o and down GEMMs, in place
(worker/folded_ops.py). On the H200 that is two launches fewer a layer: decode graphs of 64,
128 and 256 rows 4.6%, 3.6% and 2.2% faster (benchmarks/RESULTS.md, twenty-sixth session).

Invariant (tested against transformers family by family, tests/worker/test_flat_model.py, folded
and not): the merged decoder computes what transformers' decoder computes over the same rows,
up to the floating-point reassociation of one GEMM instead of several and, folded, the
rounding of the folded weights.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from enginespec.worker import folded_ops  # noqa: F401 - registers silu_mul_rows, add_linear_
from enginespec.worker.step_context import current_or_none
from enginespec.worker.switches import env_switch

# transformers model_type values whose decoder layers MergedDecoder reproduces.
MERGEABLE_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")
# "0": never fold the norms into the projections; "1": fold wherever possible, the CPU included;
# unset: fold on CUDA (MergedDecoder.fold_norms).
FOLD_NORMS_ENV = "ENGINESPEC_FOLD_NORMS"
# Unset or "1": folded layers' fused calls take the "rscale" variants (each row's norm scale in
# the GEMM's epilogue: fused_calls); "0": they RMS-norm x with the unit weight (the "norm"
# variants). On by default since the fifty-second session: on an H100 (3f937ec,
# benchmarks/RESULTS.md) the decode graphs at 1-2 rows were equal, at 4, 8 and 16 rows 2%, 7%
# and 1% faster, at 32 rows 3% slower (still under 2x its floor), the t 0.6 workload equal.
ROW_SCALE_ENV = "ENGINESPEC_ROW_SCALE"


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


# model_type values whose attention passes config.sliding_window to every layer (transformers'
# Mistral). Qwen2/3 set a window per layer on the module; Llama never windows, even where its
# config.json carries a "sliding_window" key (transformers keeps it as an unused attribute).
CONFIG_WINDOW_MODEL_TYPES = ("mistral",)


def layer_window(attn: nn.Module, passed: Optional[int]) -> int:
    """The sliding window of one attention module (0 = full): the module's own setting first
    (Qwen2/3 set it per layer type), else what the model passes it (Mistral: config.sliding_window
    for every layer; Llama: nothing)."""
    window = attn.sliding_window if hasattr(attn, "sliding_window") else passed
    return int(window) if window else 0


def config_window(config, layer_idx: int) -> Optional[int]:
    """The window a family's attention forward passes layer `layer_idx` when the module holds
    none of its own: config.sliding_window for the CONFIG_WINDOW_MODEL_TYPES (every layer); for
    Qwen2 under transformers that work it out in the forward (4.51-4.5x: no per-layer
    attribute), config.sliding_window from max_window_layers on where use_sliding_window, as
    that forward does; None for the others (Llama never windows, whatever its config holds)."""
    kind, window = getattr(config, "model_type", None), getattr(config, "sliding_window", None)
    if kind in CONFIG_WINDOW_MODEL_TYPES:
        return window
    legacy_qwen2 = kind == "qwen2" and getattr(config, "use_sliding_window", False) and window is not None
    if legacy_qwen2 and layer_idx >= getattr(config, "max_window_layers", 0):
        return window
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The computation of every supported family's RMSNorm module (float32 statistics, the
    normalised value cast back to x's dtype, then scaled), with `weight` broadcast over x's
    trailing dims: here [Hq + Hkv, D], so Qwen3's q_norm and k_norm run as one op over q|k."""
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def is_plain_rms_norm(module: nn.Module) -> bool:
    """Whether a norm module is the weight * normed RMSNorm every supported family uses (its
    weight and `variance_epsilon` are all a fused kernel needs)."""
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D], cos/sin [N, D] -> the rotate-half rotary embedding of every supported family
    (`apply_rotary_pos_emb`: x * cos + rotate_half(x) * sin, in that order)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class MergedLayer(nn.Module):
    """One decoder layer: hidden [N, hidden] -> [N, hidden] (attention through the paged op).
    q and k are normed (Qwen3) and rotated together as one [N, Hq + Hkv, D] tensor: one fused
    kernel under compilation where per-tensor modules give two."""

    def __init__(self, hf_layer: nn.Module, layer_idx: int, config, fuse_qkv_rope: bool = False):
        super().__init__()
        self.fuse_qkv_rope = fuse_qkv_rope
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.layer_idx = layer_idx
        self.head_dim = int(attn.head_dim)
        self.num_q = int(attn.q_proj.weight.shape[0]) // self.head_dim
        self.num_kv = int(attn.k_proj.weight.shape[0]) // self.head_dim
        self.scale = float(attn.scaling)
        self.window = layer_window(attn, config_window(config, layer_idx))
        self.input_layernorm = hf_layer.input_layernorm
        self.post_attention_layernorm = hf_layer.post_attention_layernorm
        self.o_proj, self.down_proj, self.act_fn = attn.o_proj, mlp.down_proj, mlp.act_fn
        self.qk_norm_weight, self.qk_norm_eps = self._qk_norm(attn)
        # q_norm and k_norm (Qwen3) for restack_qk_norm, outside the module tree (a plain tuple)
        self._qk_norm_modules = (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
        qkv_w, qkv_b = merge_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up_w, gate_up_b = merge_linears([mlp.gate_proj, mlp.up_proj])
        self.qkv_weight = nn.Parameter(qkv_w, requires_grad=False)  # [(Hq + 2 Hkv) D, hidden]
        self.qkv_bias = None if qkv_b is None else nn.Parameter(qkv_b, requires_grad=False)
        self.gate_up_weight = nn.Parameter(gate_up_w, requires_grad=False)  # [2 I, hidden]
        self.gate_up_bias = None if gate_up_b is None else nn.Parameter(gate_up_b, requires_grad=False)
        # The projection GEMM (x, weight, bias) -> x @ weight.T + bias: F.linear unless the runner
        # points it elsewhere (skinny_ops.install: a measured cuBLAS-or-Triton choice).
        self.linear = F.linear
        # Or the whole layer as four fused calls (fused_calls): set by skinny_ops.install where
        # can_fuse(); (x, weight, bias, norm_weight, eps, residual, silu_mul) -> tensor.
        self.fused_linear = None
        self.silu_mlp = getattr(config, "hidden_act", None) in ("silu", "swish")
        # Set by fold_norms: the norms' weights live in qkv_weight and gate_up_weight.
        self.folded = False

    def projections(self) -> list[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """(weight, bias) of every GEMM this layer runs through `linear`: q|k|v, gate|up, and
        o and down when they are plain Linear modules (a tensor-parallel rank's are not)."""
        out = [(self.qkv_weight, self.qkv_bias), (self.gate_up_weight, self.gate_up_bias)]
        out += [(m.weight, m.bias) for m in (self.o_proj, self.down_proj) if type(m) is nn.Linear]
        return out

    def _project(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """module(x) for o_proj/down_proj, through `linear` when it is a plain Linear."""
        if type(module) is nn.Linear:
            return self.linear(x, module.weight, module.bias)
        return module(x)

    def can_fuse(self) -> bool:
        """Whether forward may run as fused_calls: o and down are plain Linear modules, both
        norms are the weight * normed RMSNorm every supported family uses, the MLP is SiLU."""
        norms = (self.input_layernorm, self.post_attention_layernorm)
        return (
            self.silu_mlp
            and all(type(m) is nn.Linear for m in (self.o_proj, self.down_proj))
            and all(is_plain_rms_norm(m) for m in norms)
        )

    def can_fold_norms(self) -> bool:
        """Whether fold_norms may run: can_fuse's conditions, no bias on any projection (a bias
        would have to be added after the row scale, not before it), q|k|v going through the
        backend's fused op (it applies the input norm's scale), and not float16: the GEMMs then
        read the un-normed residual rows, whose outputs can pass float16's 65,504 (models carry
        residual values in the thousands) where the normed rows' never do; bfloat16 and the
        float32 family have float32's range."""
        linears = (self.o_proj, self.down_proj)
        return (
            self.can_fuse()
            and self.fuse_qkv_rope
            and self.qkv_weight.dtype != torch.float16
            and self.qkv_bias is None
            and self.gate_up_bias is None
            and all(m.bias is None for m in linears)
        )

    @torch.no_grad()
    def fold_norms(self) -> None:
        """q|k|v weight <- weight diag(input_layernorm.weight), gate|up weight <- weight
        diag(post_attention_layernorm.weight) (in float32, rounded once, in place: the q/k/v and
        gate/up Linear modules are views of them), and both norms' weights <- 1. Every path
        computes the same function after it: transformers' modules, fused_calls (a norm of unit
        weight) and _forward_folded (no norm launch). Only where can_fold_norms()."""
        if not self.can_fold_norms():
            raise ValueError(f"layer {self.layer_idx}: its norms cannot be folded (can_fold_norms)")
        for weight, norm in (
            (self.qkv_weight, self.input_layernorm),
            (self.gate_up_weight, self.post_attention_layernorm),
        ):
            weight.copy_((weight.float() * norm.weight.float()[None, :]).to(weight.dtype))
        # the checkpoint's norm weights, kept for weight updates (worker/weight_update.py)
        self.register_buffer(
            "folded_input_norm", self.input_layernorm.weight.detach().clone(), persistent=False
        )
        self.register_buffer(
            "folded_post_norm", self.post_attention_layernorm.weight.detach().clone(), persistent=False
        )
        for norm in (self.input_layernorm, self.post_attention_layernorm):
            norm.weight.fill_(1.0)
        self.folded = True

    @property
    def folded_norm_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, post-attention) norms' checkpoint weights folded into q|k|v and gate|up."""
        return self.folded_input_norm, self.folded_post_norm

    @torch.no_grad()
    def restack_qk_norm(self) -> None:
        """qk_norm_weight (a stacked copy of q_norm's and k_norm's weights) from the modules'
        weights again, in place: after a weight update (worker/weight_update.py)."""
        if self.qk_norm_weight is None:
            return
        attn_norms = self._qk_norm_modules
        d = self.head_dim
        stacked = torch.cat(
            [attn_norms[0].weight.expand(self.num_q, d), attn_norms[1].weight.expand(self.num_kv, d)]
        )
        self.qk_norm_weight.copy_(stacked)

    def fused_calls(self) -> list[dict]:
        """The four fused calls of a layer, in order, as their static arguments (the variant
        names skinny_linear.py's): norm + q|k|v, o + residual, norm + gate|up + SiLU * up,
        down + residual. Folded (fold_norms), the norms' unit weights stay in the calls (the
        baseline norms with them) and the calls carry row_scale: a kernel that takes them
        multiplies its results by each row's RMS scale instead (ENGINESPEC_ROW_SCALE=0 turns that
        off: benchmarks/RESULTS.md, fiftieth to fifty-second sessions)."""
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        scaled = self.folded and env_switch(ROW_SCALE_ENV) is not False
        norm = {"variant": "rscale", "row_scale": True} if scaled else {"variant": "norm"}
        return [
            dict(
                norm,
                weight=self.qkv_weight,
                bias=self.qkv_bias,
                norm_weight=ln1.weight,
                eps=float(ln1.variance_epsilon),
            ),
            dict(variant="residual", weight=self.o_proj.weight, bias=self.o_proj.bias),
            dict(
                norm,
                variant=norm["variant"] + "_silu",
                weight=self.gate_up_weight,
                bias=self.gate_up_bias,
                norm_weight=ln2.weight,
                eps=float(ln2.variance_epsilon),
                silu_mul=True,
            ),
            dict(variant="residual", weight=self.down_proj.weight, bias=self.down_proj.bias),
        ]

    def _qk_norm(self, attn: nn.Module) -> tuple[Optional[nn.Parameter], float]:
        """Qwen3's q_norm and k_norm weights stacked per head, [Hq + Hkv, D] (a copy: weights
        are frozen once loaded), or (None, 0.0) for families without them."""
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is None:
            return None, 0.0
        if q_norm.variance_epsilon != k_norm.variance_epsilon:
            raise ValueError("MergedLayer: q_norm and k_norm must share one epsilon")
        d = self.head_dim
        weight = torch.cat(
            [q_norm.weight.detach().expand(self.num_q, d), k_norm.weight.detach().expand(self.num_kv, d)]
        )
        return nn.Parameter(weight, requires_grad=False), float(q_norm.variance_epsilon)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] (normed) -> o_proj output [N, hidden]."""
        qkv = self.linear(x, self.qkv_weight, self.qkv_bias)  # [N, (Hq + 2 Hkv) D]
        return self._project(self.o_proj, self._attend(qkv, cos, sin))

    def _attend(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        row_source: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """q|k|v rows [N, (Hq + 2 Hkv) D] -> attention output [N, Hq D] (K/V written).
        row_source (folded norms): the un-normed hidden rows whose norm scale the backend applies."""
        n, d, num_qk = qkv.shape[0], self.head_dim, self.num_q + self.num_kv
        if self.fuse_qkv_rope:  # the backend norms, rotates and writes K/V from the raw rows
            extra = () if row_source is None else (row_source, float(self.input_layernorm.variance_epsilon))
            out = torch.ops.enginespec.paged_attention_qkv(
                qkv,
                cos,
                sin,
                self.qk_norm_weight,
                self.qk_norm_eps,
                self.layer_idx,
                self.num_q,
                self.scale,
                self.window,
                *extra,
            )
            return out.reshape(n, self.num_q * d)
        qk = qkv[:, : num_qk * d].view(n, num_qk, d)  # [N, Hq + Hkv, D]
        v = qkv[:, num_qk * d :].view(n, self.num_kv, d)  # [N, Hkv, D]
        if self.qk_norm_weight is not None:
            qk = rms_norm(qk, self.qk_norm_weight, self.qk_norm_eps)
        qk = rotate_neox(qk, cos, sin)  # cos/sin [N, D]
        q, k = qk[:, : self.num_q], qk[:, self.num_q :]
        out = torch.ops.enginespec.paged_attention(q, k, v, self.layer_idx, self.scale, self.window)
        return out.reshape(n, self.num_q * d)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.linear(x, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
        return self._project(self.down_proj, self.act_fn(gate) * up)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool = False
    ) -> torch.Tensor:
        """fused (the decoder decides by row count): run as fused_calls when fused_linear is set."""
        if fused and self.fused_linear is not None:
            return self._forward_fused(hidden, cos, sin)
        if self.folded:
            return self._forward_folded(hidden, cos, sin)
        hidden = hidden + self.attention(self.input_layernorm(hidden), cos, sin)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def _forward_folded(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """forward after fold_norms, without a norm launch: the GEMMs read the un-normed rows,
        the backend's q|k|v kernel and SiLU * up apply the norms' row scales, and the residual
        adds run inside the o and down GEMMs, in place (folded_ops.add_linear_: one rounding
        where forward has two). `hidden` is updated in place and returned."""
        n = hidden.shape[0]
        qkv = self.linear(hidden, self.qkv_weight, None)  # [N, (Hq + 2 Hkv) D], un-normed rows
        attn = self._attend(qkv, cos, sin, row_source=hidden).reshape(n, self.num_q * self.head_dim)
        torch.ops.enginespec.add_linear_(hidden, attn, self.o_proj.weight)
        gate_up = self.linear(hidden, self.gate_up_weight, None)  # [N, 2 I], un-normed rows
        eps = float(self.post_attention_layernorm.variance_epsilon)
        act = torch.ops.enginespec.silu_mul_rows(gate_up, hidden, eps)
        torch.ops.enginespec.add_linear_(hidden, act, self.down_proj.weight)
        return hidden

    def _forward_fused(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """forward as fused_calls: the same values up to where the roundings fall (the norms,
        the residual adds and SiLU * up run inside the GEMM launches)."""
        f = self.fused_linear
        norm_qkv, o_res, norm_gate_up, down_res = self.fused_calls()

        def normed(x, c):  # a norm call: q|k|v, gate|up with SiLU * up
            silu, row_scale = c.get("silu_mul", False), c.get("row_scale", False)
            return f(x, c["weight"], c["bias"], c["norm_weight"], c["eps"], None, silu, row_scale)

        qkv = normed(hidden, norm_qkv)
        hidden = f(self._attend(qkv, cos, sin), o_res["weight"], o_res["bias"], None, 0.0, hidden, False)
        act = normed(hidden, norm_gate_up)
        return f(act, down_res["weight"], down_res["bias"], None, 0.0, hidden, False)


# Rope types whose cos/sin depend on the position alone (a table holds them); others (dynamic
# NTK, longrope) rescale with the longest position seen, so they are computed every forward.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class PerRequestRope(nn.Module):
    """A non-static rope module (dynamic NTK, longrope) computed request by request.

    transformers' modules of these types scale their frequencies by the longest position they
    are called with (`torch.max(position_ids) + 1`), and dynamic NTK also keeps the largest
    scaling it has seen until a call falls back under the original length. Over a flat batch
    that made one request's cos/sin depend on the other requests of the step (and on earlier
    steps). Here each request's rows (the active step's query_start_loc) go through a fresh copy
    of the module, so a request gets what transformers computes over that request's rows alone
    (its own context length, no history). Runs eagerly: the segments are host ints of the step,
    so it is kept out of torch.compile, and a runner must not capture it in a CUDA graph
    (FlatModel.rope_per_request)."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.pristine = rotary  # never called itself: every call copies it
        self.rope_type = getattr(rotary, "rope_type", "default")

    def _fresh(self) -> nn.Module:
        """A copy of the module as loaded (its buffers copied, its config shared)."""
        config = getattr(self.pristine, "config", None)
        return copy.deepcopy(self.pristine, {} if config is None else {id(config): config})

    @torch.compiler.disable
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (any rows: only its dtype and device are read), position_ids [1, N] -> cos, sin [1, N, D]."""
        n = position_ids.shape[-1]
        ctx = current_or_none()
        bounds = [0, n] if ctx is None else [int(b) for b in ctx.meta.query_start_loc_cpu.tolist()]
        if bounds[-1] < n:
            bounds.append(n)
        parts = [self._fresh()(x, position_ids[:, a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
        if len(parts) == 1:
            return parts[0]
        return torch.cat([c for c, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1)


# Rope scalings that stretch the positions a model was trained on by their factor (vLLM's rule:
# llama3 and longrope checkpoints state their extended length in max_position_embeddings already).
_STRETCHING_ROPE_TYPES = ("linear", "dynamic", "yarn")


def max_positions(text_config) -> int:
    """The longest context the checkpoint serves, as vLLM derives it: max_position_embeddings,
    or for a linear, dynamic or yarn rope scaling (config.rope_parameters, or rope_scaling in
    older configs) the factor times the positions it stretches (yarn: its
    original_max_position_embeddings when given). Qwen's documented yarn factor 4 over 32,768
    positions serves 131,072."""
    base = int(text_config.max_position_embeddings)
    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if not isinstance(rope, dict):
        return base
    kind = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor")
    if kind not in _STRETCHING_ROPE_TYPES or not isinstance(factor, (int, float)) or factor <= 1:
        return base
    if kind == "yarn" and rope.get("original_max_position_embeddings"):
        base = int(rope["original_max_position_embeddings"])
    return int(base * factor)


class MergedDecoder(nn.Module):
    """input_ids, positions [N] -> final-norm hidden [N, hidden], built over a transformers
    decoder (`model.model`) whose modules and weights it shares.

    fuse_qkv_rope (the attention backend has `write_qkv`): each layer hands its raw q|k|v rows
    to `enginespec::paged_attention_qkv`, and the backend norms and rotates q|k and writes K/V
    in one kernel; otherwise the norm and rotary run here (rms_norm, rotate_neox) and the
    backend gets q, k, v through `enginespec::paged_attention`.

    cos/sin come from the checkpoint's rotary embedding module: for static rope types computed
    once for every position into a table (the same values the module returns per step: each is
    one float32 product, cast to the model dtype), so a step gathers its rows instead of
    recomputing them in every layer's kernel."""

    def __init__(self, hf_decoder: nn.Module, config, fuse_qkv_rope: bool = False):
        super().__init__()
        self.embed_tokens = hf_decoder.embed_tokens
        self.rotary_emb = hf_decoder.rotary_emb
        self.norm = hf_decoder.norm
        num_layers = int(config.num_hidden_layers)
        # Steps of at most this many rows run the layers' fused calls when they have them (set
        # by skinny_ops.install to the rows it measured); bigger steps keep the compiled
        # decoder's own fusions (residual add + norm, SiLU * up), which serve many rows better.
        self.fused_max_rows = 0
        self.layers = nn.ModuleList(
            MergedLayer(layer, i, config, fuse_qkv_rope)
            for i, layer in enumerate(hf_decoder.layers[:num_layers])
        )
        # The final norm as one launch on the fused path (set by skinny_ops.install, like the
        # layers' fused_linear): (x, weight, eps) -> RMSNorm(x). None: the checkpoint's module
        # (eager, that is eight elementwise launches at the end of every batch-1 step).
        self.fused_norm = None
        # The step's two gathers (embedding rows, rope-table rows) as one launch on the fused
        # path (set by skinny_ops.install): (input_ids, positions, embedding weight, rope table)
        # -> (hidden [N, hidden], cos|sin [N, 2, D]). None: embed_tokens and rope().
        self.fused_embed_rope = None
        static = getattr(self.rotary_emb, "rope_type", "default") in STATIC_ROPE_TYPES
        table = self._rope_table(max_positions(config)) if static else None
        self.register_buffer("rope_table", table, persistent=False)  # [P, 2, D] (cos, sin) or None

    @torch.no_grad()
    def _rope_table(self, num_positions: int) -> torch.Tensor:
        """[P, 2, D]: cos and sin of each position side by side, so a step gathers both with one
        index launch (two tables took two)."""
        weight = self.embed_tokens.weight
        positions = torch.arange(num_positions, device=weight.device)[None]
        cos, sin = self.rotary_emb(weight[:1], positions)  # [1, P, D] each
        return torch.stack([cos[0], sin[0]], dim=1).contiguous()

    def cover_positions(self, num_positions: int) -> None:
        """Grow the cos/sin table to num_positions rows when it has fewer (a max_model_len past
        max_positions, allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN): every position a step may
        hold stays inside the table, which the gathers index unchecked. Never shrinks; call
        before graphs are captured, as a new table is a new tensor."""
        if self.rope_table is not None and self.rope_table.shape[0] < num_positions:
            self.rope_table = self._rope_table(num_positions)

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, D] of the rows' positions (with a table: views of one gathered [N, 2, D]
        tensor, row stride 2 D, contiguous along D). index_select, not table[positions]: on the
        H200 its kernel took 1.8 us a step where advanced indexing's took 3.5."""
        if self.rope_table is not None:
            both = torch.index_select(self.rope_table, 0, positions)
            return both[:, 0], both[:, 1]
        cos, sin = self.rotary_emb(hidden, positions[None])
        return cos[0], sin[0]

    @torch.no_grad()
    def fold_norms(self, setting: Optional[bool] = None) -> bool:
        """Fold every layer's norms into its projections (MergedLayer.fold_norms) when all can
        and `setting` (default: ENGINESPEC_FOLD_NORMS, unset = on for CUDA weights) allows.
        Returns whether it folded. Call before any tuning or compilation: the weights change."""
        if setting is None:
            env = env_switch(FOLD_NORMS_ENV)
            setting = env if env is not None else self.embed_tokens.weight.is_cuda
        if not setting or not all(layer.can_fold_norms() for layer in self.layers):
            return False
        for layer in self.layers:
            if not layer.folded:
                layer.fold_norms()
        return True

    def final_norm_fusable(self) -> bool:
        """Whether the final norm is the weight * normed RMSNorm that `fused_norm` computes."""
        return is_plain_rms_norm(self.norm)

    def embed_rope_fusable(self) -> bool:
        """Whether `fused_embed_rope` reproduces embed_tokens and rope(): a plain embedding
        lookup (no max_norm, no scaling module) and a rope table."""
        embed = self.embed_tokens
        return type(embed) is nn.Embedding and embed.max_norm is None and self.rope_table is not None

    @property
    def folded(self) -> bool:
        """Whether every layer's norms are folded (fold_norms): then the gathers and the final
        norm take their one-launch forms at every row count (nothing else would fuse them: a
        folded decoder runs uncompiled, worker/compiled.py's should_compile)."""
        return all(layer.folded for layer in self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Off (0): no comparison on N at all; on: a guard on N under torch.compile (two graphs).
        fused = self.fused_max_rows > 0 and input_ids.shape[0] <= self.fused_max_rows
        one_launch = fused or self.folded
        if one_launch and self.fused_embed_rope is not None:
            hidden, both = self.fused_embed_rope(
                input_ids, positions, self.embed_tokens.weight, self.rope_table
            )
            cos, sin = both[:, 0], both[:, 1]
        else:
            hidden = self.embed_tokens(input_ids)  # [N, hidden]
            cos, sin = self.rope(hidden, positions)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, fused)
        if one_launch and self.fused_norm is not None:
            return self.fused_norm(hidden, self.norm.weight, float(self.norm.variance_epsilon))
        return self.norm(hidden)


def can_merge(config) -> bool:
    """Whether MergedDecoder reproduces this config's decoder layers."""
    return getattr(config, "model_type", None) in MERGEABLE_MODEL_TYPES
