"""Writing files so that an interrupted run never leaves half a file behind.

Every writer in the kit goes through `atomic_write`: the bytes go to a
temporary file in the target's folder, which is renamed over the target only
once it is complete. An exception or a Ctrl-C before that removes the
temporary file and leaves the target as it was (tests/test_faults.py checks
every writer, and that no code in kit/ or scripts/ writes a file another way).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (os.umask sets it, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


_umask_lock = threading.Lock()


def _naming(error: OSError, path: Path) -> OSError:
    """`error` again, naming `path` (what the user gave) instead of the temporary file."""
    return type(error)(error.errno, error.strerror, str(path))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside `path`; rename it to `path` on success."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(target))
    folder = target.parent or Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:  # no such folder, not a folder, no permission: name the folder, not our temporary
        raise _naming(e, folder) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, target)
        except OSError as e:  # the target became a folder meanwhile, or cannot be replaced
            raise _naming(e, target) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
