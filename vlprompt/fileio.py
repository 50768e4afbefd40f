"""Atomic file writing: the one way the project writes a file it or its users read back.

A file is written to a temporary file in the same folder, flushed, fsynced and moved onto
its final name with ``os.replace``, so an interrupted writer (a kill, a full disk, an
exception) leaves the previous file or no file, never a torn one. Standard library only,
so light command-line tools can use it without importing torch; ``vlprompt.utils``
re-exports every name (Dassl's ``mkdir_if_missing`` included).
"""
import contextlib
import os
import os.path as osp
import tempfile

__all__ = ["atomic_write", "mkdir_if_missing", "write_text", "save_figure"]


def _current_umask():
    """The process umask (read once at import: os.umask can only be read by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def mkdir_if_missing(dirname):
    """Create ``dirname`` and its parents; no error if it already exists (race-safe)."""
    os.makedirs(dirname, exist_ok=True)


def _fsync_directory(dirname):
    """Persist a rename inside ``dirname`` (POSIX only; a no-op where directories cannot be opened)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(dirname, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode="wb", encoding="utf-8", newline=None):
    """Context manager yielding a file object whose content replaces ``path`` atomically.

    The data goes to a temporary file in the same directory (parents are created),
    which is flushed, fsynced and then moved onto ``path`` with ``os.replace``. If the
    block raises, the temporary file is deleted and ``path`` keeps its old content (or
    stays absent): readers only ever see the old or the complete new file.

    Args:
        path (str): final file path.
        mode (str): "wb" (binary) or "w" (text).
        encoding (str): text encoding, used only with mode "w".
        newline (str | None): newline translation of mode "w", as for ``open``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f'atomic_write() supports mode "w" or "wb", but got "{mode}"')
    dirname = osp.dirname(osp.abspath(path))
    mkdir_if_missing(dirname)
    fd, tmp_path = tempfile.mkstemp(dir=dirname, prefix=f".{osp.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(tmp_path, 0o666 & ~_UMASK)
        file_kwargs = {"encoding": encoding, "newline": newline} if mode == "w" else {}
        with os.fdopen(fd, mode, **file_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if osp.exists(tmp_path):
            os.remove(tmp_path)
        raise
    _fsync_directory(dirname)


def write_text(text, fpath, newline=None):
    """Write the string ``text`` to ``fpath`` (UTF-8), atomically; parent folders are created.

    ``newline`` is passed to ``open`` ("\\n" writes line ends unchanged on every platform).
    """
    with atomic_write(fpath, "w", newline=newline) as f:
        f.write(text)


def save_figure(figure, fpath, **savefig_kwargs):
    """``figure.savefig`` to ``fpath`` atomically, in the format of its extension (e.g. ".png").

    Args:
        figure: a matplotlib Figure.
        fpath (str): the image file; its extension names the format.
        **savefig_kwargs: passed to ``savefig`` (e.g. dpi).
    """
    image_format = osp.splitext(fpath)[1][1:].lower() or None
    with atomic_write(fpath, "wb") as f:
        figure.savefig(f, format=image_format, **savefig_kwargs)
