"""The hand-off: the steps of a bind after its commit point, run on a pool of threads.

After the commit point the rest of a bind is idempotent writes to objects of that claim only
(create the ElasticGPU, bind the claim): a pool thread does them while the worker decides the
next claims. Until it is done, the claim's and the ElasticGPU's keys are "in flight": their
syncs are deferred (they would only repeat its writes) and run once it is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from elasticgpu.controller.flow.machinery.failures import Failures
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue
from elasticgpu.controller.settings import BindingSettings


class HandOff:
    """A pool of `settings.workers` threads (none: `enabled` is False and binds run inline)."""

    def __init__(self, *, queue: WorkQueue, failures: Failures, settings: BindingSettings) -> None:
        self._queue = queue
        self._failures = failures
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="bind") if settings.workers > 0 else None
        self._lock = threading.Lock()
        self._in_flight: set[Key] = set()
        """Keys whose steps after the commit point run on a pool thread."""
        self._dirty: set[Key] = set()
        """Keys in flight whose sync was asked for meanwhile: queued again when done."""
        self._closed = False
        """Set by `close`: the process stops (a lost Lease, a signal) and takes no new binds."""

    @property
    def enabled(self) -> bool:
        """True when binds are handed to the pool (False: everything runs on the worker)."""
        return self._pool is not None

    def defer(self, key: Key) -> bool:
        """True (and the key remembered for later) when `key` is in flight: its sync must wait."""
        with self._lock:
            if key in self._in_flight:
                self._dirty.add(key)
                return True
            return False

    def in_flight(self, key: Key) -> bool:
        """True while `key` is in flight."""
        with self._lock:
            return key in self._in_flight

    def busy(self) -> bool:
        """True while any bind runs on the pool."""
        with self._lock:
            return bool(self._in_flight)

    def submit(self, keys: tuple[Key, ...], work: Callable[[], None]) -> None:
        """Run `work` on the pool with `keys` in flight; a failure retries `keys[0]` (`Failures`)."""
        assert self._pool is not None
        with self._lock:
            if self._closed:
                # The process is stopping: what this bind would write after its commit point is
                # left as a crash there leaves it (the next leader's sync or repair finishes it),
                # not retried here once per queued key (a log line each) until the exit.
                return
            self._in_flight.update(keys)
            self._pool.submit(self._run, keys, work)

    def _run(self, keys: tuple[Key, ...], work: Callable[[], None]) -> None:
        failed = False
        try:
            work()
        except Exception as err:  # a pool thread never dies of a bind: the claim's next sync retries
            failed = True
            self._failures.failed(keys[0], err)
        else:
            self._failures.succeeded(keys[0])
        finally:
            with self._lock:
                self._in_flight.difference_update(keys)
                # After a failure the other keys (the ElasticGPU just created, its status not
                # written) are synced too: the claim's retry waits for what their sync writes,
                # and no watch event may come to queue them (a write whose answer was lost).
                again = [k for k in keys[1:] if failed or k in self._dirty]
                if keys[0] in self._dirty and not failed:
                    again.insert(0, keys[0])
                self._dirty.difference_update(keys)
            for key in again:
                self._queue.add(key)

    def close(self) -> None:
        """Wait for the binds in flight (bounded by their calls' timeouts)."""
        with self._lock:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
