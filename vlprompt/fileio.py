"""Atomic file writing: the one way the project writes a file it or its users read back; and
the SHA-256 of a file (:func:`file_sha256`), by which weights and archives are checked.

A file is written to a temporary file in the same folder, flushed, fsynced and moved onto
its final name with ``os.replace``, so an interrupted writer (a kill, a full disk, an
exception) leaves the previous file or no file, never a torn one. A write that fails because
the disk is full, a quota is exceeded or the file-size limit (``ulimit -f``) is reached raises
:class:`WriteFailedError` (bad input for the command lines: one paragraph, exit status 2),
naming the file and the reason. Standard library only, so light command-line tools can use it
without importing torch; ``vlprompt.utils`` re-exports every name (Dassl's ``mkdir_if_missing``
included).
"""
import contextlib
import errno
import hashlib
import os
import os.path as osp
import tempfile

__all__ = ["WriteFailedError", "atomic_write", "file_sha256", "mkdir_if_missing", "write_text", "save_figure"]

# errno -> why a write failed, for the errors that mean "no room" rather than a bug.
_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file would exceed the file-size limit (ulimit -f) or the largest file the file system holds",
}


class WriteFailedError(OSError):
    """A file could not be written for lack of room (disk full, quota, file-size limit); the file
    keeps its previous content (or stays absent). The message names the file and the reason."""


def no_room_error(error):
    """The OSError in ``error``'s chain (itself, its cause or context) whose errno means "no room", or None
    (torch.save, for one, reports a full disk as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_ROOM:
            return error
        error = error.__cause__ or error.__context__
    return None


def _write_failed(path, error):
    reason = _NO_ROOM[error.errno]
    state = "keeps its previous content" if osp.exists(path) else "was not created"
    return WriteFailedError(
        f"Could not write {path}: {reason} ({error.strerror or os.strerror(error.errno)}). Nothing was damaged: "
        f"the file is written to a temporary file that replaces it only when complete, so {path} {state}. Free "
        "space (or raise the limit), then run the same command again."
    )


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
    tmp_path = None
    try:
        mkdir_if_missing(dirname)
        fd, tmp_path = tempfile.mkstemp(dir=dirname, prefix=f".{osp.basename(path)}.", suffix=".tmp")
        os.chmod(tmp_path, 0o666 & ~_UMASK)
        file_kwargs = {"encoding": encoding, "newline": newline} if mode == "w" else {}
        with os.fdopen(fd, mode, **file_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException as error:
        if tmp_path is not None and osp.exists(tmp_path):
            os.remove(tmp_path)
        no_room = no_room_error(error)
        if no_room is not None and not isinstance(error, WriteFailedError):
            raise _write_failed(path, no_room) from error
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


def file_sha256(path):
    """Hex SHA-256 of the bytes of the file ``path`` (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
