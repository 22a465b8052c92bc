"""The torch-free heart of the engine, shared verbatim by the simulator: requests, sampling params,
block hashing, the block pool, the KV cache manager and the scheduler."""
from engine.core.async_scheduler import AsyncScheduler, make_scheduler
from engine.core.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from engine.core.outputs import (EngineCoreOutput, EngineCoreOutputs, LogprobsLists, ModelRunnerOutput,
                                 SchedulerStats)
from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.core.scheduler import Scheduler

__all__ = [
    "AsyncScheduler", "BlockPool", "CacheConfig", "CachedRequestData", "EngineCoreOutput", "EngineCoreOutputs",
    "FreeKVCacheBlockQueue", "KVCacheBlock", "KVCacheManager", "LogprobsLists", "ModelRunnerOutput",
    "NewRequestData", "PrefixCacheStats", "Request", "RequestStatus", "SamplingParams", "Scheduler",
    "SchedulerConfig", "SchedulerOutput", "SchedulerStats", "make_scheduler",
]
