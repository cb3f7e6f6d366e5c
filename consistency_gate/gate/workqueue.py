"""A work queue of items to reconcile, kept as client-go's ``util/workqueue`` keeps one: the listener's guard and
gates each work one (:mod:`consistency_gate.gate.watch`).

>>> queue = WorkQueue()
>>> queue.add("m"), queue.add("m"), len(queue)  # queued once however often it is added
(True, False, 1)
>>> item = queue.get()
>>> queue.add("m"), len(queue)  # added while processed: it runs again after
(True, 0)
>>> queue.done(item); len(queue)
1
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable


class WorkQueue:
    """A queue of items to reconcile, as client-go's workqueue keeps one: an item waiting is queued once however
    often it is added; an item added while it is processed runs again after; :meth:`add_after` adds it later."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.order: deque[Hashable] = deque()
        self.waiting: set[Hashable] = set()
        self.processing: set[Hashable] = set()
        self.again: set[Hashable] = set()
        self.closed = False

    def add(self, item: Hashable) -> bool:
        """Queue ``item`` (True), unless it waits already or the queue is closed (False)."""
        with self.cond:
            if self.closed or item in self.waiting:
                return False
            if item in self.processing:
                self.again.add(item)
                return True
            self.waiting.add(item)
            self.order.append(item)
            self.cond.notify()
            return True

    def add_after(self, item: Hashable, seconds: float) -> None:
        """Queue ``item`` in ``seconds``."""
        timer = threading.Timer(seconds, self.add, (item,))
        timer.daemon = True
        timer.start()

    def get(self) -> Hashable | None:
        """The next item, marked as processed (None once the queue is closed)."""
        with self.cond:
            while not self.order and not self.closed:
                self.cond.wait()
            if self.closed:
                return None
            item = self.order.popleft()
            self.waiting.discard(item)
            self.processing.add(item)
            return item

    def done(self, item: Hashable) -> None:
        """``item`` is processed: queued again if it was added meanwhile."""
        with self.cond:
            self.processing.discard(item)
            if item in self.again:
                self.again.discard(item)
                self.waiting.add(item)
                self.order.append(item)
                self.cond.notify()

    def close(self) -> None:
        """Take no more items; waiting workers get None."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def __len__(self) -> int:
        return len(self.order)
