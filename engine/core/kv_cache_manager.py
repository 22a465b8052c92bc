"""Per-request block bookkeeping on top of the BlockPool: prefix lookup, slot allocation, freeing."""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_pool import BlockPool, KVCacheBlock
from engine.core.request import Request, RequestStatus


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


NO_PREFIX_CACHE_STATS = PrefixCacheStats()  # a step that admitted nobody: read, never written
_NO_BLOCKS: list[KVCacheBlock] = []  # shared by callers that only read it: nothing newly allocated
_WAITING_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
# (kind, request id, block ids, hashes): kind new / hit / cache / free, hashes (hex) for cache only.
BlockEvent = tuple[str, str, list[int], list[str] | None]


def _blocks_to_take(num_tokens: int, num_held: int, hits: list[KVCacheBlock], block_size: int) -> int:
    """Blocks to take from the free queue for `num_tokens` slots: new ones, plus prefix hits that sit
    evictable in the free queue (touching them takes them out of it)."""
    num_new = -(-num_tokens // block_size) - num_held - len(hits)
    if num_new < 0:
        num_new = 0
    if not hits:
        return num_new
    return num_new + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)


class KVCacheManager:
    """Full-attention KV cache manager: one block list per request, hashes from the request.

    When `events` is a list, every change of block ownership or cache state is appended to it as
    (kind, request_id, block_ids, hashes) with kind in new / hit / cache / free, so a trace can
    rebuild the pool at any step.
    """

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True,
                 watermark: float = 0.0) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        # vLLM 0.32 (SchedulerConfig.watermark) counts the watermark over all blocks, null block included.
        self.watermark_blocks = int(watermark * num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        # Per request, how many computed tokens its held blocks take with no block allocated and none
        # filled for publishing: one lookup tells the scheduler a decode needs no allocate_slots.
        self.slot_limit: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        self.events: list[BlockEvent] | None = None
        # Why the last allocate_slots returned None: (whole-sequence check, blocks needed, blocks free).
        self.last_shortfall: tuple[bool, int, int] = (False, 0, 0)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks, capped so the last prompt token is still computed
        (the model must produce logits for it)."""
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        if len(request.block_hashes) < max_hit_blocks:  # output tokens are hashed when read (a resumed request)
            request.update_block_hashes()
        get = self.block_pool.cached_block_hash_to_block.get
        blocks: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            same = get(block_hash)
            if same is None:
                break
            blocks.append(next(iter(same.values())) if isinstance(same, dict) else same)
        return blocks, len(blocks) * self.block_size

    def record_prefix_hit(self, request: Request, num_hit_tokens: int) -> None:
        """Called by the scheduler once a request is admitted, so a request that waits counts once."""
        if self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)

    def num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                               new_computed_blocks: list[KVCacheBlock] = _NO_BLOCKS) -> int:
        """Blocks `allocate_slots` takes from the free queue for `num_tokens` slots of the request."""
        held = self.req_to_blocks.get(request_id)
        return _blocks_to_take(num_tokens, len(held) if held is not None else 0, new_computed_blocks, self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False, has_scheduled_reqs: bool = True,
                       ) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens after the computed ones (including new prefix hits).

        Returns the newly allocated blocks, or None when the pool is short; on None nothing changes,
        so the caller can preempt and retry. `full_sequence_must_fit` is vLLM 0.32's admission gate
        (`scheduler_reserve_full_isl`): the whole current sequence must fit, not just this chunk. The
        watermark holds back blocks from waiting and preempted requests while others run.
        """
        rid = request.request_id
        req_blocks = self.req_to_blocks.get(rid)
        num_held = len(req_blocks) if req_blocks is not None else 0
        hits = new_computed_blocks or _NO_BLOCKS
        block_size = self.block_size
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        num_slots = num_computed + num_new_tokens + num_lookahead_tokens
        if num_slots > self.max_model_len:
            num_slots = self.max_model_len
        need = _blocks_to_take(num_slots, num_held, hits, block_size)
        # A running request's blocks, or a chunk within held ones, take nothing: no check to make.
        if need or full_sequence_must_fit or self.watermark_blocks:
            num_free = self.block_pool.free_block_queue.num_free_blocks
            watermark = self.watermark_blocks if has_scheduled_reqs and request.status in _WAITING_STATUSES else 0
            if full_sequence_must_fit:
                full = min(request.num_tokens, self.max_model_len)
                if (whole := _blocks_to_take(full, num_held, hits, block_size) + watermark) > num_free:
                    self.last_shortfall = (True, whole, num_free)
                    return None
            if need + watermark > num_free:
                self.last_shortfall = (False, need + watermark, num_free)
                return None
        if req_blocks is None:
            req_blocks = self.req_to_blocks[rid] = []
            self.num_cached_block[rid] = 0
            self.slot_limit[rid] = 0
        if hits:
            self.block_pool.touch(hits)
            req_blocks.extend(hits)
            self.num_cached_block[rid] = len(req_blocks)
            if self.events is not None:
                self.events.append(("hit", rid, [b.block_id for b in hits], None))
        num_to_allocate = -(-num_slots // block_size) - len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_to_allocate) if num_to_allocate > 0 else _NO_BLOCKS
        if new_blocks:
            req_blocks.extend(new_blocks)
            if self.events is not None:
                self.events.append(("new", rid, [b.block_id for b in new_blocks], None))
        if new_blocks or hits:
            self._set_slot_limit(rid, len(req_blocks))
        end = num_computed + num_new_tokens
        if self.enable_caching and end // block_size > self.num_cached_block[rid]:
            num_tokens = len(request.all_token_ids)
            self._cache_blocks(request, req_blocks, end if end < num_tokens else num_tokens)
        return new_blocks

    def _set_slot_limit(self, request_id: str, num_blocks: int) -> None:
        limit = num_blocks * self.block_size
        if self.enable_caching:  # the next block to fill must be published when its last slot is computed
            publish_at = (self.num_cached_block[request_id] + 1) * self.block_size
            if publish_at <= limit:
                limit = publish_at - 1
        self.slot_limit[request_id] = limit

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publish the request's blocks filled up to `num_computed_tokens` (async scheduling calls this
        once sampled tokens are known)."""
        blocks = self.req_to_blocks.get(request.request_id)
        if self.enable_caching and blocks is not None:
            self._cache_blocks(request, blocks, num_computed_tokens)

    def _cache_blocks(self, request: Request, req_blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Publish blocks that become full with this step's tokens (their content is known now)."""
        num_full = num_tokens // self.block_size
        if num_full > len(request.block_hashes):
            request.update_block_hashes()  # the scheduler hashes output tokens only when they are read
            if num_full > len(request.block_hashes):
                num_full = len(request.block_hashes)
        if num_full > len(req_blocks):
            num_full = len(req_blocks)
        num_cached = self.num_cached_block[request.request_id]
        if num_full > num_cached:
            newly = self.block_pool.cache_full_blocks(req_blocks, request.block_hashes, num_cached, num_full)
            self.num_cached_block[request.request_id] = num_full
            self._set_slot_limit(request.request_id, len(req_blocks))
            if newly and self.events is not None:
                self.events.append(("cache", request.request_id, [b.block_id for b in newly],
                                    [h.hex() for b in newly if (h := b.block_hash) is not None]))

    def free(self, request: Request) -> list[int]:
        """Release a request's blocks, tail first so its prefix stays cached longest; returns their ids.

        As in vLLM 0.32, blocks keep the hashes they were published under even when the request is
        preempted in the very step that scheduled it (their KV never written): vLLM decides so, and
        the next steps' block ids and hits depend on it.
        """
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        self.slot_limit.pop(request.request_id, None)
        if not blocks:
            return []
        self.block_pool.free_blocks(reversed(blocks))
        ids = [b.block_id for b in blocks]
        if self.events is not None:
            self.events.append(("free", request.request_id, ids, None))
        return ids

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Hand out the stats gathered since the last call and start afresh. This runs every step and
        most steps admit nobody: then the one shared empty record is handed out (callers only read it)."""
        stats = self.prefix_cache_stats
        if not (stats.requests or stats.preempted_requests):
            return NO_PREFIX_CACHE_STATS
        self.prefix_cache_stats = PrefixCacheStats()
        return stats
