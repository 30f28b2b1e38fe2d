"""Bounded state for a server that hostile input reaches: an LRU cache with a stated size, and
locks per key that exist only while someone holds or waits for them.

Every cache the verifier keeps across requests is one of these, so what an agent can make it
remember is capped however many distinct digests, agent ids or manifests it sends
(docs/operations.md, "Contention and memory").
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most CAPACITY units of values, least recently used evicted first. WEIGHT gives a
    value's units (default 1 each: a count of entries); a single value heavier than the
    capacity is not kept at all. Thread-safe."""

    def __init__(self, capacity: int, weight: Callable[[V], int] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity {capacity} is not positive")
        self.capacity = capacity
        self._weight = weight or (lambda _: 1)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.size = 0  # units held now
        self.evicted = 0  # entries evicted so far

    def get(self, key: K) -> V | None:
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[0]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, key: K, value: V) -> None:
        w = max(0, self._weight(value))
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= old[1]
            if w > self.capacity:
                return
            self._items[key] = (value, w)
            self.size += w
            while self.size > self.capacity:
                _, (_, gone) = self._items.popitem(last=False)
                self.size -= gone
                self.evicted += 1

    def pop(self, key: K) -> V | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is None:
                return None
            self.size -= old[1]
            return old[0]


class KeyedLocks:
    """One lock per key, created on first use and dropped when its last holder or waiter
    leaves: the number of locks is bounded by the calls in progress, not by every key seen."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                _, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def held(self) -> list[Hashable]:
        """The keys held or waited for now (what is in progress)."""
        with self._guard:
            return list(self._locks)
