"""Triton kernels, each with a plain-torch reference in kernels/reference.py.

paged_attention (flat ragged batch over the paged pool, split-KV merge), kv_write, rms_norm
(fused residual add), rotary (neox), qkv_rope (q|k norm, rotary and the K/V write of a layer's
q|k|v rows), skinny_gemm (few-row GEMM with optional RMSNorm prologue, SiLU * up or residual
epilogue, single-launch split K), silu_mul (the MLP activation in one launch). Nothing here
imports the rest of enginespec; modules import triton, so import them lazily where a GPU may be
absent.
"""
