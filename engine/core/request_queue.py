"""Waiting queues: FCFS (a deque; preempted requests go back to the front) and priority (a heap).

Both are the container itself (a deque, a list) rather than a wrapper around one: the scheduler asks
`len(waiting)` and `bool(waiting)` several times a step, and the built-in's own length costs a tenth of
a Python `__len__` call.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from engine.core.request import Request


class FCFSRequestQueue(deque[Request]):
    def add_request(self, request: Request) -> None:
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        """A preempted request resumes before anything that arrived after it."""
        self.appendleft(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        """Put skipped requests back at the front, in their order."""
        self.extendleft(reversed(requests))

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return self.popleft()

    def remove_requests(self, requests: set[Request]) -> None:
        kept = [r for r in self if r not in requests]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue(list[Request]):
    """Ordered by (priority, arrival_time, request_id); a preempted request simply re-enters the heap.
    The list is the heap; iterating yields requests in priority order."""

    def add_request(self, request: Request) -> None:
        heapq.heappush(self, request)

    prepend_request = add_request

    def prepend_requests(self, requests: list[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return heapq.heappop(self)

    def remove_requests(self, requests: set[Request]) -> None:
        self[:] = [r for r in list.__iter__(self) if r not in requests]
        heapq.heapify(self)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(list.__iter__(self)))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
