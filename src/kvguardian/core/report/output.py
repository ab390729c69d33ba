"""Output files, checked before the work that fills them starts: a sweep, a program run or a test session
must never be thrown away because the file it was for could not be written."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvguardian.core.errors import UsageError

__all__ = ["HTML_HELP", "add_html_option", "check_outputs", "check_writable", "write_whole"]


def check_writable(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as a `Path` when a file can be written there (its folder exists and is writable; it is not a
    folder; an existing file is writable). ``"-"`` (standard output) always passes.

    Raises:
        UsageError: naming ``flag``, the path, what is wrong, and the fix.
    """
    p = Path(path)
    if str(path) == "-":
        return p
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        problem = "is a folder"
    elif not folder.is_dir():
        problem = f"is in a folder that does not exist ({folder})"
    elif p.exists() and not os.access(p, os.W_OK):
        problem = "exists and is not writable"
    elif not p.exists() and not os.access(folder, os.W_OK | os.X_OK):
        problem = f"is in a folder this user may not write to ({folder})"
    else:
        return p
    raise UsageError(f"{flag} {str(path)!r} {problem}; fix: pass a writable file path (checked before starting, "
                     "so no work is lost)")


def check_outputs(outputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
                  inputs: Sequence[tuple[str, str | os.PathLike[str] | None]] = ()) -> None:
    """`check_writable` for each ``(flag, path)`` of ``outputs`` (None: not asked for), and that no output is
    one of the ``(what, path)`` ``inputs`` (``--report app.py`` replaced the program with JSON) nor another
    output (``-o X --trace X`` kept only one of them).

    Raises:
        UsageError: naming the flag, the path and the clash, before any work starts.
    """
    seen: list[tuple[str, str]] = []
    named = [(what, str(path)) for what, path in inputs if path and str(path) != "-"]
    for flag, path in outputs:
        if not path:
            continue
        check_writable(path, flag)
        if str(path) == "-":
            continue
        for what, other in named + seen:
            if _same_file(str(path), other):
                raise UsageError(f"{flag} {str(path)!r} is also {what}; writing it would replace that file; "
                                 "fix: pass another path")
        seen.append((f"the {flag} file", str(path)))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): the same path once links are resolved
        return os.path.realpath(a) == os.path.realpath(b)


#: the help of every command's ``--html FILE``
HTML_HELP = "also write the result as one self-contained HTML report (as kv-guardian report draws it)"


def add_html_option(p: Any) -> None:
    """``--html FILE`` on an argparse parser (check it with `check_writable` before the work starts)."""
    p.add_argument("--html", metavar="FILE", help=HTML_HELP)


def write_whole(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so a reader never sees half of it: a temporary file next to the file, renamed
    over it. Only a regular file (or a new one) is replaced that way, through its symbolic links (the link
    stays); anything else is written in place: renaming over ``/dev/full`` or ``/dev/stdout`` replaced the
    device or the link itself with a file (as root, for every program on the machine). Raises OSError."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():  # a device, a FIFO, /dev/stdout's descriptor
        with open(target, "w", encoding="utf-8") as out:
            out.write(text)
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
