"""Child processes that die with the job.

A job killed outright (SIGKILL, the OOM killer) runs no cleanup, so the kernel must stop its
children: ``prctl(PR_SET_PDEATHSIG)``, set in the child between fork and exec. Only
async-signal-safe work may run there (the forking process may have threads — TensorFlow's,
pytest's — holding locks the child inherits), so libc and ``prctl`` are looked up here, in the
parent, and the child only makes the call.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, with its C signature declared so that a call converts no more than
    ints (resolved once: ``dlopen``/``dlsym`` take the loader's lock, unsafe after fork)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess``: the kernel sends the child ``sig`` when the calling
    process dies. Make it in the process that starts the child, just before starting it. (The
    kernel sends it when the *thread* that started the child ends: start it from one that lives
    as long as the child should.)

    The child exits at once (status 128 + ``sig``) if that process died before the call took
    effect: then the death signal was never sent, and the child's parent is no longer it.
    """
    prctl = _prctl()
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:  # between fork and exec: syscalls only
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signum)

    return preexec
