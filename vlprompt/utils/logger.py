"""Tee of ``sys.stdout`` into a log file (Dassl ``setup_logger`` semantics).

Only stdout is captured; warnings, tracebacks and progress bars (stderr) are not.
"""
import atexit
import os
import os.path as osp
import sys
from datetime import datetime

from vlprompt.run_layout import log_name, timestamped_log_name

from .tools import mkdir_if_missing

__all__ = ["Logger", "setup_logger", "close_logger"]


class Logger:
    """Write every message to the console stream and to a file.

    Args:
        fpath (str or None): log file, opened for writing (parent folders created).
            None: console only.
        console: the stream to tee (default: the current ``sys.stdout``).

    ``flush()`` flushes both and fsyncs the file. Attributes the tee does not define
    (``encoding``, ``isatty``, ...) are those of the console stream.
    """

    def __init__(self, fpath=None, console=None):
        self.console = sys.stdout if console is None else console
        self.file = None
        if fpath is not None:
            mkdir_if_missing(osp.dirname(osp.abspath(fpath)))
            self.file = open(fpath, "w", encoding="utf-8")

    def __getattr__(self, name):
        if name in ("console", "file"):
            raise AttributeError(name)
        return getattr(self.console, name)

    def write(self, msg):
        self.console.write(msg)
        if self.file is not None:
            self.file.write(msg)

    def flush(self):
        self.console.flush()
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())

    def close(self):
        """Flush, fsync and close the file; the console stream is left untouched."""
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None


_active_logger = None


def close_logger():
    """Undo :func:`setup_logger`: restore the original stdout and close the log file.

    Registered with ``atexit``; safe to call when no logger is active.
    """
    global _active_logger
    logger = _active_logger
    if logger is None:
        return
    _active_logger = None
    if sys.stdout is logger:
        sys.stdout = logger.console
    logger.close()


def _log_file_path(output):
    """The log file for ``output``: itself if it ends in .txt/.log, else the run folder's log
    ``output/log.txt`` (``output/log-rank<R>.txt`` in the process of rank R > 0 of a torchrun job,
    so that the processes never write one file; :mod:`vlprompt.run_layout`); if that file exists,
    the same name plus "-YYYY-MM-DD-HH-MM-SS"."""
    rank = int(os.environ.get("RANK", "0"))
    if output.endswith(".txt") or output.endswith(".log"):
        fpath = output
    else:
        fpath = osp.join(output, log_name(rank))
    if osp.exists(fpath):
        fpath = timestamped_log_name(fpath, datetime.now())
    return fpath


def setup_logger(output=None):
    """Tee ``sys.stdout`` into the log file of ``output`` (None: do nothing).

    A second call in the same process closes the previous log and tees the original
    stdout again, so messages are never written twice.
    """
    global _active_logger
    if output is None:
        return
    close_logger()
    fpath = _log_file_path(os.fspath(output))
    _active_logger = Logger(fpath)
    sys.stdout = _active_logger


atexit.register(close_logger)
