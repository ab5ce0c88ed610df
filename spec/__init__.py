"""enginespec's contract: Protocols, shared value types, the canonical block hash and
the canonical batch layout (build_batch).

Nothing here imports an implementation; implementations are reached through `load_impl`.
"""

from enginespec.spec.admission import check_add
from enginespec.spec.attention import AttentionBackend
from enginespec.spec.batch import PACKED_ALIGN, Batch, BatchMeta, packed_offsets, slot_of
from enginespec.spec.batch_layout import build_batch
from enginespec.spec.block_manager import BlockManager, PoolState
from enginespec.spec.config import POLICIES, PREEMPTION_MODES, SchedulerConfig
from enginespec.spec.hashing import ROOT, encode_extra, hash_block, hash_request_blocks
from enginespec.spec.impl import ENTRY_POINT_GROUP, Implementation, PartsImpl, load_impl
from enginespec.spec.params import RequestOutputKind, SamplingParams
from enginespec.spec.request import (
    Request,
    RequestArgs,
    Status,
    SupportsAsyncScheduling,
    check_request_args,
)
from enginespec.spec.scheduler import Scheduler, SchedulerOutput, UpdateOutput
from enginespec.spec.stops import length_stop, stop_after_token, token_stop
from enginespec.spec.structured_outputs import StructuredOutputsParams
from enginespec.spec.validation import (
    MAX_LOGIT_BIAS,
    MAX_N,
    check_cache_key,
    check_count,
    check_token_id,
    check_token_ids,
)

__all__ = [
    "AttentionBackend",
    "Batch",
    "BatchMeta",
    "BlockManager",
    "ENTRY_POINT_GROUP",
    "Implementation",
    "PartsImpl",
    "POLICIES",
    "PREEMPTION_MODES",
    "PoolState",
    "ROOT",
    "Request",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "Status",
    "RequestArgs",
    "build_batch",
    "check_request_args",
    "UpdateOutput",
    "SupportsAsyncScheduling",
    "MAX_LOGIT_BIAS",
    "MAX_N",
    "check_add",
    "check_cache_key",
    "check_token_id",
    "check_count",
    "check_token_ids",
    "length_stop",
    "stop_after_token",
    "token_stop",
    "encode_extra",
    "hash_block",
    "hash_request_blocks",
    "load_impl",
    "slot_of",
    "packed_offsets",
    "PACKED_ALIGN",
]
