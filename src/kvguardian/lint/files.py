"""Finding and reading the files to lint: directories walked without recursion limits or loops, every file
that cannot be linted reported as a `Skipped` line (binary, not UTF-8, unreadable, too large, a symlink loop).

The walk is a generator, so a directory of 100k files costs memory per directory, not per tree.
"""

from __future__ import annotations

import io
import os
import stat
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

from kvguardian.core.input_file import NotRegular, TooLarge, read_regular
from kvguardian.lint.config import LintConfig
from kvguardian.lint.diagnostic import Skipped

__all__ = ["LANGUAGES", "MAX_BYTES", "SourceFile", "discover", "read_source"]

#: file suffix -> language name
LANGUAGES = {".py": "python", ".pyi": "python", ".go": "go", ".java": "java", ".kt": "kotlin", ".kts": "kotlin"}
MAX_BYTES = 8 * 1024 * 1024  # larger files are generated, not written: skipped with a line
NOT_REGULAR = "not a regular file (a FIFO, device or socket); skipped"


@dataclass(frozen=True)
class SourceFile:
    path: str  # display path, '/'-separated
    language: str
    text: str


def _display(p: str) -> str:
    return p.replace(os.sep, "/")


def discover(paths: list[str], config: LintConfig) -> Iterator[str | Skipped]:
    """Yield lintable file paths under ``paths`` (sorted per directory) and `Skipped` for what is not.
    Exclusions match the part of a path below the directory named in ``paths``."""
    seen_dirs: set[tuple[int, int]] = set()
    for given in paths:
        try:
            st = os.stat(given)
        except OSError as exc:
            yield Skipped(_display(given), _os_reason(exc, given))
            continue
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(given, config, seen_dirs)
        elif _language(given) is None:
            yield Skipped(_display(given), "not a Python, Go, Java or Kotlin file (by its suffix); skipped")
        elif not stat.S_ISREG(st.st_mode):
            yield Skipped(_display(given), NOT_REGULAR)
        else:
            yield _display(given)  # named explicitly: linted even if excluded


def _walk(root: str, config: LintConfig, seen: set[tuple[int, int]]) -> Iterator[str | Skipped]:
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            st = os.stat(d)
        except OSError as exc:
            yield Skipped(_display(d), _os_reason(exc, d))
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            yield Skipped(_display(d), "directory already visited (a symbolic-link loop or a second link); skipped")
            continue
        seen.add(key)
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield Skipped(_display(d), _os_reason(exc, d))
            continue
        subdirs: list[str] = []
        for e in entries:
            path = e.path if d != "." else e.name
            # exclusions apply below the directory the user named, not to the part they typed
            if config.is_excluded(_display(path[len(root):].lstrip(os.sep)) if root != "." else _display(path)):
                continue
            try:
                is_dir = e.is_dir()  # follows links; loops are caught by the (dev, inode) set
            except OSError as exc:
                yield Skipped(_display(path), _os_reason(exc, path))
                continue
            if is_dir:
                subdirs.append(path)
            elif _language(e.name) is not None:
                yield _file_entry(e, path)
        stack.extend(reversed(subdirs))


def _file_entry(e: os.DirEntry[str], path: str) -> str | Skipped:
    """A lintable directory entry's display path, or why it is skipped (only regular files are read)."""
    try:
        if e.is_file():  # follows links: a link to a regular file is one
            return _display(path)
    except OSError as exc:
        return Skipped(_display(path), _os_reason(exc, path))
    if e.is_symlink() and not os.path.exists(path):
        return Skipped(_display(path), "broken symbolic link; skipped")
    return Skipped(_display(path), NOT_REGULAR)


def _language(name: str) -> str | None:
    return LANGUAGES.get(os.path.splitext(name)[1].lower())


def _os_reason(exc: OSError, path: str) -> str:
    if getattr(exc, "errno", None) == 40:  # ELOOP
        return "symbolic-link loop; skipped"
    if isinstance(exc, FileNotFoundError):
        return "no such file or directory (or a broken symbolic link); check the path"
    if isinstance(exc, PermissionError):
        return "permission denied; skipped"
    return f"cannot read ({exc.strerror or type(exc).__name__}); skipped"


def _too_large(path: str, size: int) -> Skipped:
    return Skipped(path, f"larger than {MAX_BYTES // (1024 * 1024)} MiB ({size} bytes), likely generated; "
                         "skipped (exclude it to silence this)")


def read_source(path: str) -> SourceFile | Skipped:
    """The file's text, or why it cannot be linted. Python honours a PEP 263 coding line; others are UTF-8."""
    language = _language(path) or "python"
    try:
        data = read_regular(path, max_bytes=MAX_BYTES)
    except OSError as exc:
        return Skipped(path, _os_reason(exc, path))
    except NotRegular:
        return Skipped(path, NOT_REGULAR)
    except TooLarge as exc:
        return _too_large(path, exc.size)
    if b"\0" in data[:8192]:
        return Skipped(path, "binary file (NUL bytes); skipped")
    encoding = "utf-8-sig"
    if language == "python":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as exc:
            if "invalid or missing encoding" in str(exc):  # undeclared non-UTF-8 bytes in the first lines
                encoding = "utf-8"
            else:
                return Skipped(path, f"bad coding declaration ({exc}); fix the coding line", line=1)
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        where = f" (byte 0x{data[exc.start]:02x} at offset {exc.start})" if isinstance(exc, UnicodeDecodeError) else ""
        return Skipped(path, f"not valid {encoding}{where}; save it as UTF-8 or declare its encoding; skipped")
    return SourceFile(path, language, text)
