"""Temporary files that a SIGTERM removes before the process ends.

An interrupt (SIGINT) raises ``KeyboardInterrupt``, and the atomic writers of :mod:`sixbit.files.safetensors`
remove their temporary files on the way out. SIGTERM's default action (what ``kill PID``, a job
scheduler or a container stop send) ends the process at once, and the files stayed: a streamed
conversion's data file holds every block written so far, gigabytes for a large model. So while
a tracked file exists, a SIGTERM handler is installed that removes the tracked files, puts back
the default action and raises the signal again: the process ends as it would have, killed by
SIGTERM, with no temporary file left (and the target file, replaced only by a rename, either
the previous one or absent).

The handler is installed only from the main thread (Python allows no other) and only where
SIGTERM has its default action: a handler the caller installed, or ``SIG_IGN``, is left alone
(a handler that raises ends the writers through their cleanup, as SIGINT does). It is removed
when the last tracked file is untracked on the main thread, unless something replaced it
meanwhile. SIGKILL cannot be caught: its files are removed by the next save to the same path
(:class:`sixbit.files.safetensors.SafetensorsWriter` removes the temporary files of processes that are gone).
"""

from __future__ import annotations

import os
import signal
import threading

_tracked: dict[str, int] = {}  # path → pid of the process that created it (a forked child inherits the dict)
_installed = False


def _on_sigterm(signum, frame) -> None:
    """Remove this process's tracked files, then end the process by SIGTERM's default action."""
    pid = os.getpid()
    for path, owner in list(_tracked.items()):
        if owner == pid:
            try:
                os.unlink(path)
            except OSError:  # already renamed into place or removed
                pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def track(path: str | os.PathLike) -> None:
    """Remove ``path`` if SIGTERM arrives before :func:`untrack` (see the module doc)."""
    global _installed
    _tracked[os.fspath(path)] = os.getpid()
    if not _installed and _on_main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def untrack(path: str | os.PathLike) -> None:
    """Stop tracking ``path`` (renamed into place or removed); the last one restores SIGTERM's default action."""
    global _installed
    _tracked.pop(os.fspath(path), None)
    if _installed and not _tracked and _on_main_thread():
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:  # not replaced by the caller meanwhile
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _installed = False
