"""The pool of KV cache blocks: ref counts, an O(1) free queue in eviction order, and the prefix-cache map.

Free blocks stay in the free queue even while they still hold a cached hash; a cache hit takes such a
block back out of the queue ("touch"), and a block is only forgotten by the cache when it is popped for
reuse (lazy eviction). Eviction order: front of the queue first.
"""
from __future__ import annotations

from collections.abc import Iterable

from engine.core.hashing import BlockHash


class KVCacheBlock:
    """One physical block; the prev/next links make the free queue intrusive (no per-node allocation)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between two sentinels: O(1) popleft, append, appendleft, remove.

    Blocks never handed out yet (`unmade`, ids in order) are not objects until the queue hands them out:
    one more sentinel stands for their run where it sits in the queue, and each block made is appended
    to `made` (the pool's list by id). A pool then costs what its used blocks cost: a plan simulates
    pools of tens of thousands of blocks many times over and a short run touches few of them."""

    def __init__(self, blocks: list[KVCacheBlock], unmade: range = range(0), made: list[KVCacheBlock] | None = None) -> None:
        self.num_free_blocks = 0
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.append_n(blocks)
        self._unmade, self._made = unmade, made if made is not None else []
        self._run = KVCacheBlock(-2)
        if unmade:
            self.append(self._run)
            self.num_free_blocks += len(unmade) - 1

    @property
    def unmade(self) -> range:
        """Ids of the blocks not made yet, in queue order; their sentinel (block id -2) sits where they do."""
        return self._unmade

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        assert block is not None  # the head sentinel always links to a block or the tail
        if block is self._tail:
            raise ValueError("no free blocks left")
        if block is self._run:
            return self.popleft_n(1)[0]
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} free blocks, have {self.num_free_blocks}")
        out: list[KVCacheBlock] = []
        block = self._head.next_free_block
        while len(out) < n:
            assert block is not None  # fewer than n free blocks was refused above
            if block is self._run:
                out.extend(self._make(n - len(out)))
                if self._unmade:
                    break
                block = self._run.next_free_block
                self._run.prev_free_block = self._run.next_free_block = None
                continue
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        assert block is not None
        self._head.next_free_block = block
        block.prev_free_block = self._head
        self.num_free_blocks -= n
        return out

    def make_all(self) -> KVCacheBlock:
        """Make every unmade block, linked where their run sat; returns the first of them (the tail
        sentinel, or the block after the run, when there were none)."""
        run = self._run
        prev, nxt = run.prev_free_block, run.next_free_block
        if prev is None or nxt is None:
            return self._tail
        run.prev_free_block = run.next_free_block = None
        first = prev
        for made in self._make(len(self._unmade)):
            prev.next_free_block, made.prev_free_block = made, prev
            prev = made
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        assert first.next_free_block is not None
        return first.next_free_block

    def _make(self, n: int) -> list[KVCacheBlock]:
        """The next `n` (at most) unmade blocks, made."""
        ids, self._unmade = self._unmade[:n], self._unmade[n:]
        new = [KVCacheBlock(i) for i in ids]
        self._made.extend(new)
        return new

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"{block} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        assert last is not None  # the tail sentinel always links back to a block or the head
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """`append` each of `blocks` in order, linked in one pass: a finished request frees all its blocks."""
        if not blocks:
            return
        prev = self._tail.prev_free_block
        assert prev is not None
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def appendleft(self, block: KVCacheBlock) -> None:
        first = self._head.next_free_block
        assert first is not None
        self._head.next_free_block = block
        block.prev_free_block = self._head
        block.next_free_block = first
        first.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block in queue order (the unmade ones made: this is for inspection, not the hot path)."""
        out: list[KVCacheBlock] = []
        block = self._head.next_free_block
        while block is not None and block is not self._tail:
            if block is self._run:
                block = self.make_all()
                continue
            out.append(block)
            block = block.next_free_block
        return out

    def unlink(self) -> None:
        """Drop every link, sentinels included: neighbours reference each other, so a queue let go of
        linked is a chain of reference cycles that only the garbage collector frees. The queue is
        unusable afterwards."""
        block: KVCacheBlock | None = self._head
        while block is not None:
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        self.num_free_blocks = 0


class BlockPool:
    """Owns every block. Block 0 is the null block: never handed out, used to pad block tables.

    As in vLLM 0.32, equal content may be cached in several blocks at once (two requests that filled the
    same prefix in the same steps): the map keeps every such block under the hash, a hit takes the first
    one cached, and each block stays evictable on its own.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks: need at least 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.made_blocks: list[KVCacheBlock] = []  # by id: the blocks handed out so far (the queue makes them)
        self.free_block_queue = FreeKVCacheBlockQueue([], unmade=range(num_blocks), made=self.made_blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # Hash -> the block cached under it or, while several blocks hold equal content, a dict of them by
        # id in caching order (as vLLM 0.32): a dict per cached block would be one more long-lived object
        # per block_size tokens decoded, and those drive the garbage collector's full passes.
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        self.num_evictions = 0

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """Every block by id, those never handed out made now: for inspection (the hot path and snapshots
        use `made_blocks`, as the others are free and uncached)."""
        self.free_block_queue.make_all()
        return self.made_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block a hit on `block_hash` takes: the first one cached under it."""
        entry = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(entry.values())) if isinstance(entry, dict) else entry

    def cached_blocks(self, block_hash: BlockHash) -> list[KVCacheBlock]:
        """Every block cached under `block_hash`, first cached first."""
        entry = self.cached_block_hash_to_block.get(block_hash)
        if entry is None:
            return []
        return list(entry.values()) if isinstance(entry, dict) else [entry]

    def cache_full_blocks(self, blocks: list[KVCacheBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int) -> list[KVCacheBlock]:
        """Register blocks[num_cached:num_full] under their hashes; returns the blocks that became cached."""
        table = self.cached_block_hash_to_block
        newly = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None or block.is_null:
                continue
            h = block.block_hash = block_hashes[i]
            same = table.get(h)
            if same is None:
                table[h] = block
            elif isinstance(same, dict):
                same[block.block_id] = block
            else:
                table[h] = {same.block_id: same, block.block_id: block}
            newly.append(block)
        return newly

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks off the front of the free queue, evicting any stale cached hash they carry."""
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:
                self.uncache(block)
                self.num_evictions += 1
            block.ref_cnt = 1
        return blocks

    def uncache(self, block: KVCacheBlock) -> None:
        """Drop one block from the prefix cache (others holding the same content stay)."""
        table = self.cached_block_hash_to_block
        h = block.block_hash
        if h is None:
            return
        same = table.get(h)
        if same is block:
            del table[h]
        elif isinstance(same, dict):
            same.pop(block.block_id, None)
            if len(same) == 1:
                table[h] = next(iter(same.values()))
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache hits; a hit on a free block removes it from the free queue."""
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference; blocks reaching zero become free, in the order given (callers pass a
        request's blocks tail first): uncached ones go, as a run, to the front of the queue (reused
        first), cached ones to the LRU tail, as vLLM 0.32's BlockPool.free_blocks does."""
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        caching = self.enable_caching
        for block in ordered_blocks:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (last if caching and block.block_hash is not None else first).append(block)
            elif block.ref_cnt < 0:
                raise RuntimeError(f"{block} freed more often than it was taken")
        queue = self.free_block_queue
        for block in reversed(first):
            queue.appendleft(block)
        queue.append_n(last)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held, as vLLM does."""
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.made_blocks:
            block.block_hash = None
        return True

    def release(self) -> None:
        """The end of the pool: its blocks are freed as soon as nothing else holds them, not left to the
        garbage collector's passes over the live heap (a capacity plan lets go of a pool of tens of
        thousands of blocks per simulated run). Unusable afterwards."""
        self.free_block_queue.unlink()
        self.cached_block_hash_to_block.clear()

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_used_blocks(self) -> int:
        """Blocks held by requests or cached but not free: the pool's usage, as every report counts it."""
        return self.num_blocks - 1 - self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        return self.get_num_used_blocks() / (self.num_blocks - 1)
