"""How long the caller waits for its workers, what Ctrl-C does while they run, and what the caller
is told when one ended (:mod:`.driver`).

Every wait for the workers' answers lasts at most ``$SIXBIT_WORKER_TIMEOUT`` seconds (default
1800, also the workers' collective timeout); past it they are stopped and the caller gets a
:class:`~.driver.WorkerError`. Ctrl-C while they run kills them all before the caller's handler
raises ``KeyboardInterrupt``: code that swallows it (a ``__del__``, a handler that returns) can
no longer leave a call waiting on ranks stuck in different collectives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

TIMEOUT = "SIXBIT_WORKER_TIMEOUT"  # seconds a wait for the workers (and their collectives) may last


def timeout() -> float:
    """``$SIXBIT_WORKER_TIMEOUT`` seconds (default 1800, torch's own default for collectives)."""
    return float(os.environ.get(TIMEOUT, 1800))


def expired(op: str, ranks: list[int]) -> str:
    """The error's message when workers ``ranks`` did not answer ``op`` in time."""
    return f"worker(s) {ranks} did not answer a {op} within {timeout():g} s (${TIMEOUT}): every worker is stopped"


def ended(rank: int, process, when: str) -> str:
    """The error's message when worker ``rank`` (its ``process``) ended ``when`` (killed, crashed)."""
    process.join(10)  # its exit code, once the kernel has reaped it
    return (f"worker {rank} (pid {process.pid}) ended with exit code {process.exitcode} {when}: every worker is "
            "stopped; call close() to run the model here, or close() and wrap it again")


@contextlib.contextmanager
def killed_on_ctrl_c(processes: list) -> Iterator[None]:
    """While the workers run a request: SIGINT kills them all before the caller's own handler runs
    (``KeyboardInterrupt``), so they never wait on each other in different collectives."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):  # Ctrl-C ignored here (or set outside Python): left as it is
        yield
        return

    def interrupted(signum, frame):
        for p in processes:
            with contextlib.suppress(OSError, ValueError):
                p.kill()
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
