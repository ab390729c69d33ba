"""Reading a file the user names (a report, a scan, a keys file, a source to lint): only a regular file, and at
most a stated size, so a FIFO, ``/dev/zero`` or a huge file gives one clear line instead of a hang or a
MemoryError. The checks are made on the opened file (a FIFO swapped in after a directory walk is never read:
opening does not block, reading never starts). Standard input is not read here."""

from __future__ import annotations

import os
import stat

from kvguardian.core.errors import UsageError

__all__ = ["MAX_DOCUMENT_BYTES", "NotRegular", "TooLarge", "read_input", "read_regular"]

#: the most a JSON document (a report, a scan) may hold: its parse takes about ten times that in memory
MAX_DOCUMENT_BYTES = 512 << 20


class NotRegular(ValueError):
    """The path is a folder, a FIFO, a device or a socket (``kind`` says which, in words)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class TooLarge(ValueError):
    """The file holds more than the bytes asked for (``size``: as much as is known of it)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def read_regular(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``.

    Raises:
        OSError: it cannot be opened.
        NotRegular: it is not a regular file.
        TooLarge: it is larger than ``max_bytes`` (or grew past it while being read).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # checked before fdopen, which refuses a folder with its own error
        os.close(fd)
        raise NotRegular("a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe, device or socket)")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > max_bytes:
            raise TooLarge(info.st_size)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the stat
        raise TooLarge(len(data))
    return data


def read_input(path: str | os.PathLike[str], what: str, *, max_bytes: int) -> bytes:
    """`read_regular`, every refusal one `UsageError` line naming ``what`` ("report file 'r.json'")."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except OSError as exc:
        raise UsageError(f"cannot read {what}: {exc.strerror or exc}") from None
    except NotRegular as exc:
        raise UsageError(f"{what} is {exc.kind}; fix: pass a file") from None
    except TooLarge as exc:
        raise UsageError(f"{what} is {exc.size:,} bytes, more than the {max_bytes:,} read; fix: pass the file the "
                         "command wrote") from None
