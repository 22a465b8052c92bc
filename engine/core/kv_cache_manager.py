"""Per-request block bookkeeping on top of the BlockPool: prefix lookup, slot allocation, freeing."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_pool import BlockPool, KVCacheBlock
from engine.core.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """Counted once per admission of a request: queries are prompt tokens looked up, hits the reused ones."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


_NO_BLOCKS: list[KVCacheBlock] = []  # shared by callers that only read it: nothing newly allocated


class KVCacheManager:
    """Full-attention KV cache manager: one block list per request, hashes from the request.

    When `events` is a list, every change of block ownership or cache state is appended to it as
    (kind, request_id, block_ids, hashes) with kind in new / hit / cache / free / uncache, so a trace can
    rebuild the pool at any step.
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True,
                 watermark: float = 0.0) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.watermark_blocks = int(watermark * self.block_pool.num_usable_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.events: list[tuple] | None = None

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks, capped so the last prompt token is still computed
        (the model must produce logits for it)."""
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        get = self.block_pool.cached_block_hash_to_block.get
        blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def record_prefix_hit(self, request: Request, num_hit_tokens: int) -> None:
        """Called by the scheduler once a request is admitted, so a request that waits counts once."""
        if self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       num_lookahead_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens after the computed ones (including new prefix hits).

        Returns the newly allocated blocks, or None when the pool is short; on None nothing changes,
        so the caller can preempt and retry.
        """
        req_blocks = self.req_to_blocks.get(request.request_id)
        if req_blocks is not None and not new_computed_blocks and not num_lookahead_tokens:
            # The common decode case: the held blocks have room, nothing to allocate or touch.
            end = request.num_computed_tokens + num_new_tokens
            if len(req_blocks) * self.block_size >= end:
                if self.enable_caching and end // self.block_size > self.num_cached_block[request.request_id]:
                    self._cache_blocks(request, req_blocks, min(end, len(request.all_token_ids)))
                return _NO_BLOCKS
        num_held = len(req_blocks) if req_blocks is not None else 0
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_needed_tokens = min(num_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        num_hit_blocks = len(new_computed_blocks) if new_computed_blocks else 0
        num_to_allocate = -(-num_needed_tokens // self.block_size) - num_held - num_hit_blocks
        pool = self.block_pool
        if num_to_allocate > 0 or num_hit_blocks:
            # Hit blocks sitting in the free queue stop being free once touched.
            num_free = pool.get_num_free_blocks()
            if num_hit_blocks:
                num_free -= sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
            reserve = self.watermark_blocks if num_held == 0 else 0
            if num_to_allocate > num_free - reserve:
                return None
        if req_blocks is None:
            req_blocks = self.req_to_blocks[request.request_id] = []
            self.num_cached_block[request.request_id] = 0
        events = self.events
        if num_hit_blocks:
            pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request.request_id] = len(req_blocks)
            if events is not None:
                events.append(("hit", request.request_id, [b.block_id for b in new_computed_blocks], None))
        new_blocks = pool.get_new_blocks(num_to_allocate) if num_to_allocate > 0 else []
        if new_blocks:
            req_blocks.extend(new_blocks)
            if events is not None:
                events.append(("new", request.request_id, [b.block_id for b in new_blocks], None))
        if self.enable_caching:
            self._cache_blocks(request, req_blocks, min(num_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _cache_blocks(self, request: Request, req_blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Publish blocks that become full with this step's tokens (their content is known now)."""
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        num_cached = self.num_cached_block[request.request_id]
        if num_full > num_cached:
            newly = self.block_pool.cache_full_blocks(req_blocks, request.block_hashes, num_cached, num_full)
            self.num_cached_block[request.request_id] = num_full
            if newly and self.events is not None:
                self.events.append(("cache", request.request_id, [b.block_id for b in newly],
                                    [b.block_hash.hex() for b in newly]))

    def free(self, request: Request) -> list[int]:
        """Release a request's blocks, tail first so its prefix stays cached longest; returns their ids.

        Blocks published this step but not yet computed (a request preempted in the step that scheduled
        it) lose their hash first, so no later request can hit KV that was never written.
        """
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        if not blocks:
            return []
        pool = self.block_pool
        uncached = []
        for block in blocks[request.num_computed_tokens // self.block_size:]:
            if block.block_hash is not None and block.ref_cnt == 1:
                pool.uncache(block)
                uncached.append(block.block_id)
        pool.free_blocks(reversed(blocks))
        ids = [b.block_id for b in blocks]
        if self.events is not None:
            if uncached:
                self.events.append(("uncache", request.request_id, uncached, None))
            self.events.append(("free", request.request_id, ids, None))
        return ids

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Hand out the stats gathered since the last call and start afresh."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats
