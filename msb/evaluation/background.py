"""Background jobs of the evaluator: low-priority threads that the submitting thread helps when it has to wait.

The evaluator hands each image's prediction file and metrics to :class:`BackgroundJobs`. Its threads run at a
lower scheduling priority (``nice``; Linux applies it to the calling thread only, ``man 2 setpriority``, NOTES),
so on a machine whose cores the forward pass fills they take idle time only and the forward runs as fast as
alone. Because a low-priority thread can also be starved by *other* processes, the submitting thread never just
waits for them: when the queue is over its bounds, or at :meth:`BackgroundJobs.finish`, it takes the oldest job
not yet started and runs it itself (at its own priority). So the jobs always finish at least as fast as if the
caller ran them one by one, and errors are raised in submission order, at :meth:`~BackgroundJobs.finish` or at
the :meth:`~BackgroundJobs.submit` that finds one.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Any, Callable

__all__ = ["BackgroundJobs"]


class BackgroundJobs:
    """A queue of jobs run by ``workers`` low-priority threads and, when it has to wait, by its caller.

    Args:
        workers: background threads (at least 1).
        nice: ``nice`` increment of each background thread (Linux; ignored elsewhere or where refused).
        max_jobs, max_bytes: bounds of the queued (not yet finished) jobs, in jobs and in the ``size`` the
            caller declares for each (e.g. the bytes of its arrays); over either bound, :meth:`submit` runs
            queued jobs in the calling thread until back under it.
        name: thread name prefix.

    Use as a context manager (the threads stop at exit; jobs not run by then are dropped).
    """

    def __init__(self, workers: int, nice: int, max_jobs: int, max_bytes: int, name: str = "msb-job"):
        self._nice = int(nice)
        self._max_jobs, self._max_bytes = int(max_jobs), int(max_bytes)
        self._cv = threading.Condition()
        self._queue: deque[tuple[int, Callable[..., Any], tuple, int]] = deque()
        self._running = 0
        self._queued_bytes = 0
        self._errors: list[tuple[int, BaseException]] = []
        self._seq = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{k}", daemon=True)
                         for k in range(max(1, int(workers)))]
        for t in self._threads:
            t.start()

    def __enter__(self) -> "BackgroundJobs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, fn: Callable[..., Any], *args: Any, size: int = 0) -> None:
        """Queue ``fn(*args)`` (declared ``size`` counts against ``max_bytes``).

        Raises:
            BaseException: the first error of an earlier job, if one has failed (the job is not queued).
        """
        with self._cv:
            self._raise_first_error()
            self._queue.append((self._seq, fn, args, int(size)))
            self._seq += 1
            self._queued_bytes += int(size)
            self._cv.notify()
        while self._over_bounds() and self._run_one():
            pass

    def finish(self) -> None:
        """Run queued jobs in the calling thread until none is left, wait for the running ones, then raise the
        first error (in submission order) of any job.

        Raises:
            BaseException: that error.
        """
        while self._run_one():
            pass
        with self._cv:
            while self._running:
                self._cv.wait()
            self._raise_first_error()

    def close(self) -> None:
        """Stop the background threads (after their current job) and drop the jobs not started."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _over_bounds(self) -> bool:
        with self._cv:
            return len(self._queue) + self._running > self._max_jobs or self._queued_bytes > self._max_bytes

    def _raise_first_error(self) -> None:
        if self._errors:
            raise min(self._errors, key=lambda e: e[0])[1]

    def _take(self) -> tuple[int, Callable[..., Any], tuple, int] | None:
        """The oldest queued job, counted as running (call with the condition held)."""
        if not self._queue:
            return None
        self._running += 1
        return self._queue.popleft()

    def _run(self, job: tuple[int, Callable[..., Any], tuple, int]) -> None:
        seq, fn, args, size = job
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by finish/submit
            with self._cv:
                self._errors.append((seq, exc))
        finally:
            with self._cv:
                self._running -= 1
                self._queued_bytes -= size
                self._cv.notify_all()

    def _run_one(self) -> bool:
        """Run the oldest queued job in the calling thread; False when none is queued."""
        with self._cv:
            job = self._take()
        if job is None:
            return False
        self._run(job)
        return True

    def _work(self) -> None:
        if sys.platform.startswith("linux") and self._nice:
            try:
                os.nice(self._nice)  # this thread only (Linux)
            except OSError:
                pass
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._take()
            if job is not None:
                self._run(job)
