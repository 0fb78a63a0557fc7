"""Writing files so that nothing the user has is lost: to a temporary file beside the target,
flushed to disk, then moved into place in one step. A full disk or a crash leaves the old file
whole; an existing file is only replaced when asked."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Collection
from pathlib import Path

from tokenviz.contract.errors import TokenvizError


def _umask() -> int:
    """The process's umask (read once, at import, before any thread could write a file)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # as open() would create the file: a temporary file alone is 0600


def write_file(path: str | Path, text: str, replace: bool = False) -> Path:
    """Write `text` to `path` atomically. Without `replace`, an existing `path` is an error."""
    path = Path(path).expanduser()
    if not replace and path.exists():
        raise TokenvizError(f"{path} exists already: choose another name (or --force to replace it)")
    temporary = None
    try:
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as f:
            temporary = Path(f.name)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, FILE_MODE)
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # fails if the name was taken meanwhile: never a silent overwrite
    except FileExistsError:
        raise TokenvizError(f"{path} exists already: choose another name (or --force to replace it)") from None
    except OSError as exc:
        raise TokenvizError(f"cannot write {path}: {exc.strerror or exc}") from None
    except UnicodeEncodeError:  # a lone surrogate: no file can hold it as UTF-8
        raise TokenvizError(f"cannot write {path}: its text is not valid Unicode") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink()
    return path


def free_name(stem: str, suffixes: tuple[str, ...], directory: str | Path = ".", taken: Collection[str] = ()) -> str:
    """`stem`, or `stem-2`, `stem-3`, ...: the first not in `taken` for which no file with any of
    `suffixes` exists."""
    directory = Path(directory)
    candidate, n = stem, 1
    while candidate in taken or any((directory / f"{candidate}{suffix}").exists() for suffix in suffixes):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate
