"""Reading a file the user names on the command line (a report, a scan, a keys file): only a regular file, and
at most a stated size, so a FIFO, ``/dev/zero`` or a huge file gives one clear line instead of a hang or a
MemoryError. Standard input is not read here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvguardian._errors import UsageError

__all__ = ["MAX_DOCUMENT_BYTES", "read_input"]

#: the most a JSON document (a report, a scan) may hold: its parse takes about ten times that in memory
MAX_DOCUMENT_BYTES = 512 << 20


def read_input(path: str | os.PathLike[str], what: str, *, max_bytes: int) -> bytes:
    """The bytes of ``path``, described as ``what`` in errors ("report file 'r.json'").

    Raises:
        UsageError: it cannot be opened, is not a regular file, or is larger than ``max_bytes``.
    """
    try:
        fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is then refused
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe, device or socket)"
        raise UsageError(f"{what} is {kind}; fix: pass a file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > max_bytes:
            raise UsageError(f"{what} is {info.st_size:,} bytes, more than the {max_bytes:,} read; fix: pass the "
                             "file the command wrote")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while being read
        raise UsageError(f"{what} grew past {max_bytes:,} bytes while being read; fix: pass a finished file")
    return data
