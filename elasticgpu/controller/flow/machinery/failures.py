"""What happens when a sync fails: the key is retried with backoff, and the failure is logged
once, with the object and the reason.

    expected race            NotFound (the object is being deleted), Conflict (409: someone
                             changed it; the sync re-read it)          -> DEBUG
    API server unreachable   ApiUnavailable without an HTTP status     -> DEBUG (`KubeApi`
                             says WARNING once when it goes, INFO once when it is back)
    any other ControllerError (a 403, a 422, a 5xx, too many conflicts) -> WARNING, once per
                             key and reason until the key syncs again
    anything else (a bug)    -> ERROR with the traceback, once per key and reason

Nothing is ever raised out of `failed`: the worker and the hand-off pool call it for every
exception, so no thread dies of a sync.
"""

from __future__ import annotations

import logging
import threading

from elasticgpu.controller import errors
from elasticgpu.controller.flow.machinery.workqueue import Key, WorkQueue

logger = logging.getLogger(__name__)


def describe(key: Key) -> str:
    """A key as a user names the object: `claim ns/name`, `egpu name`."""
    return f"{key[0]} {'/'.join(key[1:])}"


def is_expected_race(err: BaseException) -> bool:
    """True for the failures two writers or a deletion cause in normal operation."""
    return isinstance(err, errors.NotFound | errors.Conflict)


def is_unreachable(err: BaseException) -> bool:
    """True when the API server could not be reached at all (no HTTP answer)."""
    return isinstance(err, errors.ApiUnavailable) and err.status == 0


class Failures:
    """Requeues failed keys (`WorkQueue.add_after_failure`) and logs each failure once."""

    def __init__(self, queue: WorkQueue) -> None:
        self._queue = queue
        self._said: dict[Key, str] = {}
        """The reason last logged above DEBUG for each key that has not synced since."""
        self._lock = threading.Lock()

    def failed(self, key: Key, err: BaseException) -> None:
        """The sync of `key` raised `err`: retry it later and say why (once)."""
        try:
            delay = self._queue.add_after_failure(key)
            what = describe(key)
            if is_expected_race(err) or is_unreachable(err):
                logger.debug("sync of %s: %s; retrying in %.3fs", what, err, delay)
                return
            reason = f"{type(err).__name__}: {err}"
            with self._lock:
                repeated = self._said.get(key) == reason
                self._said[key] = reason
            if repeated:
                logger.debug("sync of %s failed again, retrying in %.3fs: %s", what, delay, reason)
            elif isinstance(err, errors.ControllerError):
                logger.warning("sync of %s failed, retrying in %.3fs: %s", what, delay, err)
            else:
                logger.error("sync of %s failed (a bug), retrying in %.3fs: %s", what, delay, reason, exc_info=err)
        except Exception:  # never let the failure path itself kill a worker
            logger.exception("sync of %s failed and could not be requeued", describe(key))

    def succeeded(self, key: Key) -> None:
        """`key` synced: its backoff starts over, and its next failure is logged again."""
        self._queue.forget(key)
        if key in self._said:
            with self._lock:
                self._said.pop(key, None)
