"""Byte credits for one direction of one data stream (guest side, thread based)."""

from __future__ import annotations

import threading
import time


class Credit:
    """Bytes the peer allows us to send. ``take`` blocks until some are available."""

    def __init__(self, initial: int) -> None:
        self._n = initial
        self._closed = False
        self._cond = threading.Condition(threading.Lock())

    def add(self, n: int) -> None:
        with self._cond:
            self._n += n
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def take(self, want: int, timeout: float | None = None) -> int:
        """Take up to ``want`` bytes of credit; 0 if closed or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._n <= 0 and not self._closed:
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return 0
                    self._cond.wait(left)
            if self._closed:
                return 0
            n = min(want, self._n)
            self._n -= n
            return n


class Grant:
    """Receiver side: counts consumed bytes and says when to send a ``credit`` frame."""

    def __init__(self, batch: int) -> None:
        self._batch = batch
        self._pending = 0
        self._lock = threading.Lock()

    def consumed(self, n: int, *, flush: bool = False) -> int:
        """Record ``n`` consumed bytes; return how much credit to grant now (maybe 0)."""
        with self._lock:
            self._pending += n
            if self._pending >= self._batch or (flush and self._pending > 0):
                g = self._pending
                self._pending = 0
                return g
            return 0
