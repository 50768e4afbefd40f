"""The lock of a run folder: one process at a time trains or evaluates into an ``OUTPUT_DIR``.

The lock is the file ``OUTPUT_DIR/run.lock``, a JSON object naming its holder::

    {"pid": 4242, "host": "node3", "started": "2026-11-27T21:50:49+00:00",
     "process_start": "123456", "token": "<random hex>"}

(``process_start``: the holder's start in clock ticks since boot, where ``/proc`` tells it.)

It is created complete or not at all: the record is written to a temporary file (through ``atomic_write``) that is then
hard-linked to ``run.lock`` (``os.link`` fails when the name exists, as ``O_CREAT | O_EXCL``
does, also on NFS), so a second process never reads a half-written lock. A process that finds
a lock refuses with :class:`RunFolderBusyError`, naming the holder, unless the lock is stale:

* on the same host, when the holder's process is gone (its pid is not running, or runs a process
  started at another time than the holder: the pid was reused);
* from another host, when it is older than :data:`FOREIGN_LOCK_STALE_AFTER` (72 hours; its
  process cannot be asked from here).

A stale lock is taken over with a line saying whose it was and why it is stale (a run killed
with SIGKILL leaves one). The holder removes the lock when it ends, also on an exception.
:meth:`RunLock.live_holder` tells, without taking it, whether a live process holds a lock. The
same lock under another file name holds other folders (the protocol runner's ``grid.lock`` on its
output root), with its own :meth:`RunLock.busy_message`. Standard library only.
"""
import json
import os
import secrets
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Optional

from vlprompt.fileio import atomic_write
from vlprompt.run_layout import LOCK_FILENAME

__all__ = ["LOCK_FILENAME", "FOREIGN_LOCK_STALE_AFTER", "RunFolderBusyError", "RunLock", "describe_holder"]

FOREIGN_LOCK_STALE_AFTER = timedelta(hours=72)
_TAKEOVER_ATTEMPTS = 5


class RunFolderBusyError(RuntimeError):
    """Another live process holds the run folder."""


def _process_start(pid: int) -> Optional[str]:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    None where ``/proc`` does not tell (not Linux, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count from its end
    return stat[stat.rindex(")") + 2:].split()[19]


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def describe_holder(holder: dict) -> str:
    """"pid P on host H, started T" of a lock record."""
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"


class RunLock:
    """Context manager holding ``folder/run.lock`` (the folder is created).

    Args:
        folder: the run folder (``OUTPUT_DIR``).
        filename: the lock file's name in ``folder`` (another lock of the same kind, e.g. the
            protocol runner's on its output root).

    Raises (on entering):
        RunFolderBusyError: a live process holds the folder; the message (:meth:`busy_message`)
            names its pid, host and start time, and the lock file.
    """

    def __init__(self, folder, filename: str = LOCK_FILENAME):
        self.folder = Path(folder)
        self.path = self.folder / filename
        self.record: Optional[dict] = None

    def busy_message(self, holder: dict) -> str:
        """Why a process cannot take the lock that ``holder`` (a live process) holds, and what to do."""
        return (f"The run folder {self.folder} is in use by another run ({describe_holder(holder)}): two runs writing "
                f"one folder would do the work twice and overwrite each other. Wait for it to end, or give this "
                f"run another --output-dir. If that process is gone, delete {self.path}.")

    def live_holder(self) -> Optional[dict]:
        """The record of the live process that holds the lock (its "pid", "host", "started"), or None
        when there is no lock or it is stale. Reads only."""
        holder = self._read(self.path)
        return holder if holder is not None and self._stale(holder) is None else None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()
        return False

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {
            "pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
            "process_start": _process_start(os.getpid()), "token": secrets.token_hex(8),
        }
        for _ in range(_TAKEOVER_ATTEMPTS):
            if self._create(record):
                self.record = record
                return
            holder = self._read(self.path)
            if holder is None:  # removed in between, or not a lock record: try again below
                if self.path.exists():
                    self._take_over(None, f"{self.path} is not a lock record")
                continue
            why_stale = self._stale(holder)
            if why_stale is None:
                raise RunFolderBusyError(self.busy_message(holder))
            self._take_over(holder, why_stale)
        raise RunFolderBusyError(f"Could not take the lock {self.path}: other processes keep replacing it.")

    def release(self) -> None:
        """Remove the lock if it is still this holder's."""
        if self.record is None:
            return
        holder = self._read(self.path)
        if holder is not None and holder.get("token") == self.record["token"]:
            self.path.unlink()
        self.record = None

    def _create(self, record: dict) -> bool:
        """Publish ``record`` as the lock unless one exists; True when it was published."""
        temporary = self.folder / f".{self.path.name}.{record['token']}"
        with atomic_write(str(temporary), "w") as f:
            json.dump(record, f)
        try:
            os.link(temporary, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            temporary.unlink()

    @staticmethod
    def _read(path: Path) -> Optional[dict]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @staticmethod
    def _stale(holder: dict) -> Optional[str]:
        """Why ``holder``'s lock is stale, None while it is held."""
        pid = holder.get("pid")
        if holder.get("host") == socket.gethostname():
            if not isinstance(pid, int) or not _pid_running(pid):
                return "its process is gone"
            recorded = holder.get("process_start")
            if recorded is not None and _process_start(pid) not in (None, recorded):
                return "its process is gone (the pid now belongs to another process)"
            return None
        try:
            started = datetime.fromisoformat(str(holder.get("started")))
        except ValueError:
            return "it records no readable start time"
        if started.tzinfo is None:
            started = started.astimezone()
        age = datetime.now(timezone.utc) - started
        if age > FOREIGN_LOCK_STALE_AFTER:
            hours = FOREIGN_LOCK_STALE_AFTER.total_seconds() / 3600
            return f"it is from another host and older than {hours:g} hours"
        return None

    def _take_over(self, holder: Optional[dict], why_stale: str) -> None:
        """Remove the stale lock of ``holder`` (None: an unreadable file); a lock that changed
        since it was read (another process took it over first) is put back."""
        aside = self.folder / f".{self.path.name}.stale-{secrets.token_hex(8)}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = self._read(aside)
        if moved != holder:
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink()
            return
        whose = describe_holder(holder) if holder is not None else "an unreadable record"
        print(f"Taking over the stale lock {self.path} ({whose}): {why_stale}.", flush=True)
        aside.unlink()
