"""Waiting queues: FCFS (a deque; preempted requests go back to the front) and priority (a heap)."""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from engine.core.request import Request


class FCFSRequestQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._q.append(request)

    def prepend_request(self, request: Request) -> None:
        """A preempted request resumes before anything that arrived after it."""
        self._q.appendleft(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        """Put skipped requests back at the front, in their order."""
        self._q.extendleft(reversed(requests))

    def peek_request(self) -> Request:
        return self._q[0]

    def pop_request(self) -> Request:
        return self._q.popleft()

    def remove_requests(self, requests: set[Request]) -> None:
        self._q = deque(r for r in self._q if r not in requests)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityRequestQueue:
    """Ordered by (priority, arrival_time, request_id); a preempted request simply re-enters the heap."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    prepend_request = add_request

    def prepend_requests(self, requests: list[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def peek_request(self) -> Request:
        return self._heap[0]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def remove_requests(self, requests: set[Request]) -> None:
        self._heap = [r for r in self._heap if r not in requests]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
