"""enginespec's contract: Protocols, shared value types, the canonical block hash.

Nothing here imports an implementation; implementations are reached through `load_impl`.
"""
from .attention import AttentionBackend
from .batch import Batch, BatchMeta, slot_of
from .block_manager import BlockManager, PoolState
from .config import PREEMPTION_MODES, POLICIES, SchedulerConfig
from .hashing import ROOT, encode_extra, hash_block, hash_request_blocks
from .impl import ENTRY_POINT_GROUP, Implementation, load_impl
from .params import SamplingParams
from .request import Request, RequestArgs, Status, check_request_args
from .scheduler import Scheduler, SchedulerOutput, UpdateOutput

__all__ = [
    "AttentionBackend", "Batch", "BatchMeta", "BlockManager", "ENTRY_POINT_GROUP", "Implementation",
    "POLICIES", "PREEMPTION_MODES", "PoolState", "ROOT", "Request", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "Status", "RequestArgs", "check_request_args", "UpdateOutput", "encode_extra", "hash_block",
    "hash_request_blocks", "load_impl", "slot_of",
]
