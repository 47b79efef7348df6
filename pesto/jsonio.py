"""Reading and writing Pesto's JSON files: gzip by content, atomic writes,
named errors.

* :func:`load` -- a JSON document from a path, JSON text or a mapping. A file is
  gunzipped when its first bytes are gzip's magic, whatever its name, and a
  damaged file (truncated gzip, not UTF-8, nested too deep, not JSON) raises
  :class:`~pesto.errors.SchemaError` naming the file and the defect.
* :func:`write` -- JSON text to a path, gzip-compressed when the name ends in
  ``.gz`` (with a zero timestamp, so equal content gives equal bytes),
  written to a temporary file beside it and renamed over it: an interrupted
  write leaves the old file whole, never a truncated one. A path that is not
  a regular file (``/dev/stdout``, a pipe) is written in place.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.json.gz")
>>> write(path, '{"a": 1}'); load(path)
{'a': 1}
>>> open(path, "rb").read(2) == GZIP_MAGIC
True
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path

from .errors import SchemaError

__all__ = ["load", "loads", "read_text", "write", "GZIP_MAGIC"]

GZIP_MAGIC = b"\x1f\x8b"


def read_text(path) -> str:
    """The text of a file, gunzipped if it starts with gzip's magic bytes.

    Raises ``FileNotFoundError`` / ``IsADirectoryError`` as ``open`` does and
    :class:`SchemaError` for a damaged gzip stream or bytes that are not UTF-8.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise SchemaError(f"{path}: damaged gzip file ({_reason(exc)})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                          "(Pesto's JSON files are UTF-8, optionally gzipped)") from None


def loads(text: str, where: str = "JSON text"):
    """``json.loads`` with :class:`SchemaError` naming ``where`` on bad JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise SchemaError(f"{where}: not valid JSON: nested too deeply") from None


def load(source):
    """A JSON document from a mapping (returned as is), JSON text (starting
    with ``{`` or ``[``) or a path (str or ``os.PathLike``)."""
    if isinstance(source, Mapping):
        return source
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(source, str) and text.lstrip()[:1] in ("{", "["):
            return loads(text)
        return loads(read_text(text), text)
    raise SchemaError(f"expected a path, JSON text or a mapping, got {type(source).__name__}")


def write(path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename), gzip-
    compressed when the name ends in ``.gz``. On failure the temporary file is
    removed and the error (``OSError``) raised; ``path`` is left as it was."""
    data = text.encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    target = os.path.realpath(path)  # through a symlink to the file it names
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # /dev/stdout, a FIFO: no rename possible
        with open(target, "wb") as f:
            f.write(data)
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "truncated: it ends before the end of its compressed data"
    return str(exc) or type(exc).__name__
