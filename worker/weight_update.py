"""Weight updates of a running model (vLLM's `load_weights` / `reload_weights`, SGLang's
`update_weights_from_tensor` / `update_weights_from_disk`): what an RLHF framework (verl,
OpenRLHF, TRL) calls between rollouts to serve the policy it just trained.

The input is (name, tensor) pairs in the checkpoint's own names (the safetensors files' and
transformers' state_dict's: "model.layers.0.self_attn.q_proj.weight"), any subset of them.
`plan_update` checks every pair before anything is written (an unknown name, a shape or a
dtype that cannot be the parameter's, a value beyond float16's range for a float16 model as
the loader refuses one at load: a ValueError naming it, the model unchanged); then
`apply_update` copies each tensor into the live one, in place, cast to the model's dtype as the
loader casts (worker/loader.py), and re-derives what the load derived from it:
- the merged decoder's q|k|v and gate|up weights: the checkpoint's q/k/v and gate/up Linear
  weights are row views of them (merged_decoder.merge_linears), so the copy lands there;
- Qwen3's stacked q_norm|k_norm weight (MergedLayer.qk_norm_weight, a copy): stacked again;
- folded norms (MergedLayer.fold_norms: the RMSNorm weight g multiplied into the projection
  after it, the norm module's weight 1): the checkpoint's g is kept beside the layer
  (`folded_norm_weights`); a projection given is copied in raw and folded at the next forward
  (`finish_update`, which the runner calls before it runs one) with the g of that moment, so a
  norm given in a later call than its projections (bucketed updates in the files' order, where
  post_attention_layernorm follows gate and up) still folds exactly as the load did. Only a
  norm given while some of its projections were not given since the last forward rescales
  those folded rows by g_new / g_old in float32 (one more rounding; refused, ValueError, where
  g_old holds a 0: the rows are lost);
- a tied head (tie_word_embeddings): the head module holds the embedding's own tensor, so
  copying the embedding updates it; a "lm_head.weight" given for a tied model is checked and
  skipped (vLLM's rule; the loader likewise takes the embedding);
- the skinny-GEMM path (skinny_linear.py) and torch.compile read the same tensors at run time
  (no prepared copies), and captured CUDA graphs keep their pointers because every copy is in
  place: nothing to redo for them.
Rotary buffers (inv_freq, the cos/sin table) come from the config, not the checkpoint: kept.

Tensor parallelism (vLLM's rule): every rank is given the whole checkpoint tensors and keeps
its own part, cut exactly as the loader cut it (`own_shard`: tp_shard.ShardPlan.slice_for and
loader.take_slice, so column-parallel rows, row-parallel columns, the vocabulary's rows with
the last part zero-padded, a KV head replicated where there are fewer than ranks), after the
whole tensor's shape is checked against the checkpoint's (`full_shapes`); reload_weights reads
only the rank's part (`read_checkpoint`, the loader's slicer). Each rank then plans its part
with the rules above, and rank 0 has every rank's answer before any rank applies
(tp_runner.TPModelRunner._agree): all apply or none does.

Invariant (tests/api/test_weight_update.py): after the update of every tensor of checkpoint B,
in one call or in any number of calls with no forward between them, and finish_update, every
tensor of a model loaded from A, derived ones included, equals that of a model loaded from B.
Not covered: the draft model (updates reach the target only), tensors from another process
(AsyncLLM crosses reload_weights only). Under tensor parallelism the tensors given travel to
the workers pickled over their control pipes (host copies; no NCCL broadcast of device
tensors, as vLLM's RLHF examples set up, yet); tests/worker/test_tp_weight_update.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

import torch
from torch import nn

from enginespec.worker.loader import IGNORED_SUFFIXES, _tied_alias, check_float16_range, take_slice

# A folded norm's checkpoint name suffix -> the projections it folds into (MergedLayer.fold_norms).
FOLD_GROUPS = {
    "input_layernorm.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "post_attention_layernorm.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def checkpoint_tensors(model) -> dict[str, torch.Tensor]:
    """The live tensor behind every checkpoint name the model was loaded from (parameters and
    persistent buffers of the transformers module tree, as the loader expects them), the tied
    head's alias left out."""
    hf = model.hf_model
    found = dict(hf.named_parameters(remove_duplicate=False))
    for name, tensor in hf.state_dict(keep_vars=True).items():
        found.setdefault(name, tensor)
    tied = _tied_alias(hf)
    if tied is not None:
        found.pop(tied, None)
    return found


@dataclass
class _FoldGroup:
    """One folded norm and its projections: `stored` holds the norm's checkpoint weight g."""

    norm: str
    stored: torch.Tensor
    unit: torch.Tensor  # the norm module's weight: all ones once folded
    projections: dict[str, torch.Tensor]  # name -> the live (folded) row view


def fold_groups(model) -> dict[str, _FoldGroup]:
    """Norm name -> its fold group, for every folded layer of the merged decoder ({} unfolded)."""
    merged = getattr(model, "merged", None)
    if merged is None:
        return {}
    names = {id(m): n for n, m in model.hf_model.named_modules()}
    live = checkpoint_tensors(model)
    groups = {}
    for layer in merged.layers:
        if not layer.folded:
            continue
        prefix = names[id(layer.input_layernorm)].rpartition(".")[0] + "."
        for (norm, projections), stored in zip(FOLD_GROUPS.items(), layer.folded_norm_weights):
            rows = {prefix + p: live[prefix + p] for p in projections}
            groups[prefix + norm] = _FoldGroup(prefix + norm, stored, live[prefix + norm], rows)
    return groups


@dataclass
class WeightUpdate:
    """A checked update: `given` name -> tensor (as given), `groups` the fold groups it touches."""

    given: dict[str, torch.Tensor]
    live: dict[str, torch.Tensor]
    groups: list[_FoldGroup] = field(default_factory=list)


def plan_update(model, weights: Iterable, sharded: bool = False) -> WeightUpdate:
    """Check every (name, tensor) pair (module doc; a mapping, a state dict, gives its items)
    before anything is copied: ValueError for a
    pair that is not one, an unknown name, a name given twice, a shape other than the
    parameter's, a dtype that cannot be cast to it (a non-floating tensor for a floating
    parameter, or any other dtype for a non-floating one), a value beyond float16's range for
    a float16 parameter (the loader's check). On a tensor-parallel rank (model.shard_plan) each
    tensor is the full checkpoint tensor, checked against the full shape, of which the rank
    keeps its part (tensor parallelism, module doc); `sharded`: the pairs are those parts
    already (reload_weights reads only them)."""
    live = checkpoint_tensors(model)
    tied = _tied_alias(model.hf_model)
    given: dict[str, torch.Tensor] = {}
    ranges: list[tuple[str, torch.Tensor]] = []  # float16 parameters': (name, [min, max])
    if isinstance(weights, Mapping):  # a state dict itself: its items
        weights = weights.items()
    for pair in weights:
        name, tensor = _pair(pair)
        if name.endswith(IGNORED_SUFFIXES):
            continue
        target = _target(model, live, tied, name)
        if getattr(model, "shard_plan", None) is not None and not sharded:
            tensor = own_shard(model, name, tensor)
        _check_tensor(name, tensor, target)
        if name in given:
            raise ValueError(f"weight {name!r} is given twice; nothing was loaded")
        if target.dtype == torch.float16 and tensor.numel() > 0:
            ranges.append((name, torch.stack(torch.aminmax(tensor.detach())).to(torch.float16)))
        if name != tied:
            given[name] = tensor
    check_float16_range(ranges, "the weights given (nothing was loaded)")
    groups = [
        g for n, g in fold_groups(model).items() if n in given or any(p in given for p in g.projections)
    ]
    for group in groups:
        _check_rescale(group, given, _pending(model))
    return WeightUpdate(given, live, groups)


def _target(model, live: dict, tied: Optional[str], name: str) -> torch.Tensor:
    """The live tensor `name` is copied into (the embedding for a tied head's name); ValueError
    naming an unknown one."""
    target = live.get(name)
    if target is None and name == tied:
        target = model.hf_model.get_input_embeddings().weight
    if target is None:
        raise ValueError(
            f"unknown weight {name!r}: no such tensor in the {type(model.hf_model).__name__} "
            f"checkpoint (names as in its safetensors files, e.g. {next(iter(live))!r}); nothing was loaded"
        )
    return target


def full_shapes(model) -> dict[str, tuple]:
    """Checkpoint name -> the shape of the whole tensor (a tensor-parallel rank holds a part of
    some): those of the model's class built from its config on the meta device (no memory, as
    the loader builds it), once per model."""
    shapes = getattr(model, "checkpoint_shapes", None)
    if shapes is None:
        hf = model.hf_model
        with torch.device("meta"):
            whole = type(hf)(hf.config)
        shapes = {n: tuple(t.shape) for n, t in whole.state_dict(keep_vars=True).items()}
        model.checkpoint_shapes = shapes
    return shapes


def own_shard(model, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of the full checkpoint tensor `name` (a known name), cut as the loader
    cuts it (model.shard_plan.slice_for, loader.take_slice: rows or columns, the vocabulary's
    last part zero-padded); ValueError naming it where its shape is not the whole tensor's."""
    whole = full_shapes(model).get(name)
    if whole is not None and tuple(tensor.shape) != whole:
        raise ValueError(
            f"weight {name!r} has shape {list(tensor.shape)}, the model's is {list(whole)}; "
            f"nothing was loaded"
        )
    part = model.shard_plan.slice_for(name, tuple(tensor.shape))
    return tensor if part is None else take_slice(tensor, part)


def _pair(pair) -> tuple[str, torch.Tensor]:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise ValueError(
            f"weights must be (name, tensor) pairs, got {type(pair).__name__}; nothing was loaded"
        )
    name, tensor = pair
    if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
        raise ValueError(
            f"weights must be (str name, torch.Tensor) pairs, got ({type(name).__name__}, "
            f"{type(tensor).__name__}); nothing was loaded"
        )
    return name, tensor


def _check_tensor(name: str, tensor: torch.Tensor, target: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(
            f"weight {name!r} has shape {list(tensor.shape)}, the model's is {list(target.shape)}; "
            f"nothing was loaded"
        )
    castable = tensor.is_floating_point() if target.is_floating_point() else tensor.dtype == target.dtype
    if not castable:
        raise ValueError(
            f"weight {name!r} has dtype {tensor.dtype}, which cannot be the model's {target.dtype} "
            f"(floating tensors are cast to the model's dtype); nothing was loaded"
        )


def _pending(model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Projection name -> (its rows, holding the raw weight, the norm weight to fold in): what
    finish_update folds. Kept on the model (FlatModel.unfolded_rows)."""
    if getattr(model, "unfolded_rows", None) is None:
        model.unfolded_rows = {}
    return model.unfolded_rows


def _check_rescale(group: _FoldGroup, given: dict, pending: dict) -> None:
    """A norm given while some of its projections are folded (not given since the last
    forward) rescales them by g_new / g_old: impossible where g_old holds a 0 (those columns
    were folded to 0)."""
    folded = [p for p in group.projections if p not in given and p not in pending]
    if group.norm in given and folded and bool((group.stored == 0).any()):
        raise ValueError(
            f"weight {group.norm!r} is folded into {folded} with zero entries, so those rows cannot be "
            f"re-folded alone: give them in the same call; nothing was loaded"
        )


@torch.inference_mode()
def apply_update(model, update: WeightUpdate) -> None:
    """Copy a checked update into the model and re-derive (module doc). In place: every tensor
    keeps its storage, so views, the compiled body and captured CUDA graphs see the new values.
    Folded projections given wait raw for finish_update (the runner's next forward)."""
    grouped = {g.norm for g in update.groups} | {p for g in update.groups for p in g.projections}
    for name, tensor in update.given.items():
        if name not in grouped:
            update.live[name].copy_(tensor)
    pending = _pending(model)
    for group in update.groups:
        _refold(group, update.given, pending)
    merged = getattr(model, "merged", None)
    if merged is not None:
        for layer in merged.layers:
            layer.restack_qk_norm()


def _refold(group: _FoldGroup, given: dict[str, torch.Tensor], pending: dict) -> None:
    """One fold group's update (module doc): a new norm weight rescales the rows still folded,
    then the projections given are copied in raw, pending their fold."""
    new = given.get(group.norm)
    if new is not None:
        g_old = group.stored.float()
        g_new = new.to(group.stored.dtype).to(g_old.device).float()
        for name, rows in group.projections.items():
            if name not in given and name not in pending:
                rows.copy_((rows.float() / g_old[None, :] * g_new[None, :]).to(rows.dtype))
        group.stored.copy_(new)
        group.unit.fill_(1.0)  # a level-2 sleep zero-filled it
    for name, rows in group.projections.items():
        if name in given:
            rows.copy_(given[name])  # cast as the loader casts; folded by finish_update
            pending[name] = (rows, group.stored)


@torch.inference_mode()
def finish_update(model) -> None:
    """Fold the projections an update left raw (apply_update) with their norm's weight now,
    rounded once as at load (MergedLayer.fold_norms). The runner calls it before a forward;
    nothing to do (one dict lookup) otherwise."""
    pending = getattr(model, "unfolded_rows", None)
    if not pending:
        return
    for rows, stored in pending.values():
        rows.copy_((rows.float() * stored.float()[None, :]).to(rows.dtype))
    pending.clear()


def drop_pending(model) -> None:
    """Forget the raw rows waiting for finish_update (a level-2 sleep discards them)."""
    if getattr(model, "unfolded_rows", None):
        model.unfolded_rows.clear()


def read_checkpoint(model, path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint at `path`, read into host memory with our safetensors
    loader (reload_weights: one host copy of the model while it is copied in). On a
    tensor-parallel rank, only its part of each (the loader's slicer), the whole tensors'
    shapes checked first (CheckpointError naming one that differs): plan_update(sharded=True)."""
    from enginespec.worker.loader import iter_tensors

    plan = getattr(model, "shard_plan", None)
    if plan is None:
        return list(iter_tensors(path, "cpu"))
    return list(iter_tensors(path, "cpu", shapes=full_shapes(model), slicer=plan.slice_for))


def unfilled_names(model) -> set[str]:
    """The checkpoint names a level-2 sleep discards (every one: load_weights must fill them)."""
    return set(checkpoint_tensors(model))


def parameter_ids(model) -> set[int]:
    """ids of every parameter of the model (the module tree's and the merged decoder's): the
    tensors a level-2 sleep may discard. Buffers and plain attributes (rotary tables, the folded
    norms' weights) are not among them: they are kept in host memory as at level 1."""
    roots: list[nn.Module] = [model.hf_model]
    merged = getattr(model, "merged", None)
    if merged is not None:
        roots.append(merged)
    return {id(p) for root in roots for p in root.parameters()}
