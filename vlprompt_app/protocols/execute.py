"""Run the chains of a grid: sequentially, one chain per GPU slot, or as a Slurm job array.

A run is skipped only when its ``results.json`` says ``"completed": true``; anything else
(no folder, a crashed run, a run killed mid-training) is launched again, and train.py
resumes from the checkpoints it finds (:mod:`vlprompt_app.protocols.settings` first finds the
runs whose folders hold a run with other settings). No two runs of the chains may name one output
folder (:func:`check_one_run_per_folder`, checked by every backend). One runner at a time works on
an output root (:class:`GridLock`, ``OUTPUT/grid.lock``), and train.py holds its folder while it
runs (``OUTPUT_DIR/run.lock``): a run that another process holds (a train.py started by hand, a
runner over another output that shares it) is not launched but reported as *held*, naming that
process. A failing run never stops the grid: its chain's later runs (which need its checkpoint) are
marked *blocked*, every other chain goes on, and :func:`summarize` lists the failures at the end,
each with the error it ended with (:func:`error_paragraph`).

Each attempt appends the run's console output (stdout and stderr in the order they were written,
tracebacks included) to ``OUTPUT_DIR/console.txt``; ``log.txt`` stays train.py's own log.

Backends:

* :func:`run_sequential`: chains one after the other in this process's machine.
* :func:`run_queue`: one worker per device slot (``CUDA_VISIBLE_DEVICES`` set per run; a
  slot may hold several devices, e.g. "0,1" for a two-process torchrun run), each taking
  the next chain from a shared queue.
* :func:`submit_slurm`: one submitit job per chain, submitted as a job array
  (``submitit`` is an optional dependency: ``pip install -e ".[slurm]"``).
"""
from __future__ import annotations

import datetime
import gc
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO

from vlprompt.engine.run_folder import CONSOLE_FILENAME, RESULTS_FILENAME, RunFolder
from vlprompt.engine.run_lock import RunLock, describe_holder
from vlprompt.paths import repository_root
from .grid import Chain, Run

__all__ = [
    "GRID_LOCK_FILENAME", "OK", "FAILED", "SKIPPED", "BLOCKED", "HELD", "Outcome", "Launcher",
    "GridLock", "SlurmOptions", "is_completed", "check_one_run_per_folder", "pending_runs", "error_paragraph",
    "execute_chain", "Progress", "run_sequential", "run_queue", "submit_slurm", "run_chain_job", "wait_for_jobs",
    "summarize",
]

GRID_LOCK_FILENAME = "grid.lock"

OK, FAILED, SKIPPED, BLOCKED, HELD = "ok", "FAILED", "skipped", "blocked", "held"


@dataclass(frozen=True)
class Outcome:
    """What happened to one run.

    Attributes:
        run: the run.
        status: OK, FAILED, SKIPPED (already completed), BLOCKED (the training run it
            needs did not complete) or HELD (another live process holds its folder).
        seconds: wall time of the attempt (0 when not launched).
        detail: for FAILED/BLOCKED/HELD, one paragraph saying why.
        where: the worker that ran it (e.g. "gpu 1"), or "".
    """

    run: Run
    status: str
    seconds: float = 0.0
    detail: str = ""
    where: str = ""


def is_completed(output_dir) -> bool:
    """True when the run in ``output_dir`` completed (:attr:`RunFolder.completed`)."""
    return RunFolder(output_dir).completed


class GridLock(RunLock):
    """The protocol runner's hold on its output root: ``OUTPUT/grid.lock``, a
    :class:`~vlprompt.engine.run_lock.RunLock` under another name. While one runner holds it, a
    second one over the same output refuses at once (:class:`RunFolderBusyError` naming the holder),
    so that no run is started twice and no two runners append to one console.txt."""

    def __init__(self, output_root):
        super().__init__(output_root, GRID_LOCK_FILENAME)

    def busy_message(self, holder: dict) -> str:
        return (f"Another tools/run_protocol.py runs a grid into {self.folder} ({describe_holder(holder)}): two "
                f"runners over one output would start the same runs twice and write into one {CONSOLE_FILENAME}. Wait for "
                "it to end and run this command again (completed runs are skipped), or give this grid another --output. "
                f"If that process is gone, delete {self.path}.")


def _held(output_dir) -> Optional[str]:
    """"held by another process (pid P on host H, started T)" while a live process holds the folder, else None."""
    holder = RunLock(output_dir).live_holder()
    return None if holder is None else f"held by another process ({describe_holder(holder)})"


def check_one_run_per_folder(chains: Sequence[Chain]) -> None:
    """ValueError when two runs of ``chains`` name one output folder (compared as resolved
    paths): the backends would start both, and two runs writing one folder do the work twice."""
    seen: Dict[Path, Run] = {}
    for chain in chains:
        for run in chain.runs:
            folder = Path(run.output_dir).resolve()
            if folder in seen:
                raise ValueError(f"Two runs of the grid write {run.output_dir}: train.py {shlex.join(seen[folder].argv)} "
                                 f"and train.py {shlex.join(run.argv)}; each run needs a folder of its own.")
            seen[folder] = run


def pending_runs(chains: Sequence[Chain]) -> List[Run]:
    """The runs of ``chains`` that are not completed, in order."""
    return [run for chain in chains for run in chain.runs if not is_completed(run.output_dir)]


@dataclass(frozen=True)
class Launcher:
    """How a run's ``train.py`` is started (picklable, so Slurm jobs receive it).

    Attributes:
        train_script: absolute path of train.py (in-process runs check that it is the imported checkout's).
        in_process: None (each run is a subprocess), or the function that train.py runs,
            ``run(argv) -> exit status`` (:func:`vlprompt_app.commands.train.run`, passed in by the
            command line), called in this process (no interpreter start-up per run;
            CUDA_VISIBLE_DEVICES cannot be set per run).
        python: interpreter for subprocess runs.
        cwd: working directory of the runs (relative paths in configs are read from it).
        nproc_per_node: processes per training run; above 1, training runs are started by
            torchrun (DistributedDataParallel, one GPU per process), evaluation-only runs
            (``--eval-only``) stay one process. Not with ``in_process``.
    """

    train_script: str
    in_process: Optional[Callable[[List[str]], int]] = None
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)
    nproc_per_node: int = 1

    def __post_init__(self):
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be at least 1, got {self.nproc_per_node}.")
        if self.in_process and self.nproc_per_node > 1:
            raise ValueError("in-process runs are one process; nproc_per_node > 1 needs subprocess runs.")

    def command(self, run: Run) -> List[str]:
        """The subprocess command of ``run``: ``python train.py ARGV``, or for a training run
        with ``nproc_per_node`` N > 1 ``python -m torch.distributed.run --standalone
        --nproc_per_node N train.py ARGV`` (torchrun: N processes on this node, meeting on a
        free local port, so concurrent runs do not collide)."""
        if self.nproc_per_node > 1 and "--eval-only" not in run.argv:
            return [self.python, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", str(self.nproc_per_node), self.train_script, *run.argv]
        return [self.python, self.train_script, *run.argv]

    def __call__(self, run: Run, env: Dict[str, str], console: TextIO) -> int:
        """Run ``run`` with extra environment ``env``, writing its output to ``console``;
        return its exit status."""
        if self.in_process:
            if env:
                raise ValueError(f"in-process runs cannot set environment variables ({env}); "
                                 "use subprocess runs for per-run devices.")
            return _run_in_process(self.in_process, self.train_script, run.argv, console)
        console.flush()
        # unbuffered: stdout and stderr reach the console in the order they are written, so that
        # an error paragraph is not followed by output buffered before it
        return subprocess.run(self.command(run), cwd=self.cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                              stdout=console, stderr=subprocess.STDOUT).returncode


def _check_in_process_script(train_script: str) -> None:
    """In-process runs call train.py's function, which trains with the ``trainers`` and
    ``datasets`` of the imported checkout: ``train_script`` must be that checkout's train.py."""
    expected = repository_root() / "train.py"
    if Path(train_script).resolve() != expected.resolve():
        raise RuntimeError(f"in-process runs use the imported checkout's {expected}, not {train_script}; "
                           "run subprocesses instead of --in-process.")


def _run_in_process(train: Callable[[List[str]], int], train_script: str, argv: Sequence[str],
                    console: TextIO) -> int:
    _check_in_process_script(train_script)
    from vlprompt.utils import close_logger

    # What is alive before the run (the imported modules: some 400,000 objects) is frozen while it
    # runs, so the collection after it (and those its allocations trigger) walks only the run's
    # objects: about 0.2 s of CPU less per run. Frozen objects are kept, not collected; a freeze
    # made by the caller (one before forking) is left in place.
    frozen_by_caller = gc.get_freeze_count() > 0
    gc.freeze()
    with redirect_stdout(console), redirect_stderr(console):
        try:
            return train(list(argv))
        except SystemExit as exc:  # argparse errors
            return exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001  (a failing run must not stop the grid)
            traceback.print_exc(file=console)
            return 1
        finally:
            close_logger()
            _release_memory()
            if not frozen_by_caller:
                gc.unfreeze()


def _release_memory() -> None:
    """Free the finished run's objects (with a freeze in place: only those made since it) and
    CUDA's cached blocks."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def error_paragraph(output: str) -> str:
    """The error a run's console ``output`` ends with, as one line: train.py's "Error: ..." paragraph
    (bad input), or the exception line of the last traceback (a crash), whichever comes last; else
    the last line. A line rewritten with carriage returns (a progress bar) counts as its last state;
    the runner's ``====`` lines are left out."""
    lines = [line.split("\r")[-1].rstrip() for line in output.split("\n")]
    lines = [line for line in lines if not line.startswith("==== ")]
    error = max((i for i, line in enumerate(lines) if line.startswith("Error:")), default=-1)
    traceback_start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                          default=-1)
    if traceback_start > error:
        raised = next((i for i in range(traceback_start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), None)
        if raised is not None:
            return lines[raised].strip()
    if error >= 0:
        end = next((i for i in range(error, len(lines)) if not lines[i].strip()), len(lines))
        return " ".join(line.strip() for line in lines[error:end])
    printed = [line.strip() for line in lines if line.strip()]
    return printed[-1] if printed else ""


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _exit_reason(status: int) -> str:
    if status is not None and status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}" if status else f'exit status 0 but no "completed" {RESULTS_FILENAME}'


def _attempt(run: Run, launcher: Callable, env: Dict[str, str], where: str) -> Outcome:
    output_dir = Path(run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    console_path = RunFolder(output_dir).console_path
    started = time.time()
    with open(console_path, "a", encoding="utf-8") as console:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        device = "".join(f"{k}={v} " for k, v in env.items())
        console.write(f"==== {stamp}: {device}train.py {shlex.join(run.argv)}\n")
        console.flush()
        offset = console.tell()
        status = launcher(run, env, console)
        console.write(f"==== exit status {status}\n")
    seconds = time.time() - started
    if is_completed(output_dir):
        return Outcome(run, OK, seconds, where=where)
    held = _held(output_dir) if status == 2 else None  # another process took the folder first
    if held is not None:
        return Outcome(run, HELD, seconds, f"{held}; not run here (see {console_path})", where)
    error = error_paragraph(_read_from(console_path, offset))
    why = _exit_reason(status)
    detail = f"{why}: {error}" if error else why
    return Outcome(run, FAILED, seconds, f"{detail} (see {console_path})", where)


def execute_chain(chain: Chain, launcher: Callable, env: Optional[Dict[str, str]] = None,
                  report: Optional[Callable[[Outcome], None]] = None, where: str = "") -> List[Outcome]:
    """Run the chain's runs in order, skipping completed ones and blocking dependents of failures.

    Args:
        launcher: callable(run, env, console) -> exit status (a :class:`Launcher`).
        env: extra environment of every run (e.g. CUDA_VISIBLE_DEVICES).
        report: called with each Outcome as soon as it is known.
        where: worker label stored in the outcomes.
    """
    outcomes = []
    for run in chain.runs:
        if is_completed(run.output_dir):
            outcome = Outcome(run, SKIPPED, where=where)
        elif run.requires is not None and not is_completed(run.requires):
            held = _held(run.requires)
            why = f"is {held}" if held else "did not complete"
            outcome = Outcome(run, BLOCKED, detail=f"not run: {run.requires} {why}", where=where)
        elif (held := _held(run.output_dir)) is not None:
            outcome = Outcome(run, HELD, detail=f"{held}; not run here", where=where)
        else:
            outcome = _attempt(run, launcher, env or {}, where)
        outcomes.append(outcome)
        if report is not None:
            report(outcome)
    return outcomes


class Progress:
    """Prints one line per finished run: ``[k/N] status seconds [worker] run folder``.

    Thread-safe. ``pending`` are the runs that were not completed when the grid started
    (N = their number); a completed run of a chain that is skipped is not a step.
    """

    def __init__(self, pending: Sequence[Run], stream: Optional[TextIO] = None):
        self.pending = set(pending)
        self.total = len(self.pending)
        self.done = 0
        self.stream = stream
        self._lock = threading.Lock()
        self._width = len(str(self.total))

    def __call__(self, outcome: Outcome) -> None:
        if outcome.status == SKIPPED and outcome.run not in self.pending:
            return
        with self._lock:
            self.done += 1
            where = f" [{outcome.where}]" if outcome.where else ""
            timing = f"{outcome.seconds:7.1f}s" if outcome.seconds else " " * 8
            line = (f"[{self.done:>{self._width}}/{self.total}] {outcome.status:<7} {timing}"
                    f"{where} {outcome.run.label}")
            if outcome.status in (FAILED, BLOCKED, HELD):
                line += f"\n    {outcome.detail}"
            print(line, file=self.stream or sys.stdout, flush=True)


def run_sequential(chains: Sequence[Chain], launcher: Callable,
                   report: Optional[Callable[[Outcome], None]] = None) -> List[Outcome]:
    """Every chain in order on this machine."""
    check_one_run_per_folder(chains)
    return [outcome for chain in chains for outcome in execute_chain(chain, launcher, {}, report)]


def run_queue(chains: Sequence[Chain], launcher: Callable, devices: Sequence[str],
              report: Optional[Callable[[Outcome], None]] = None) -> List[Outcome]:
    """Chains spread over device slots: a worker per entry of ``devices`` (an entry may repeat
    to run several chains on one GPU) takes the next chain as soon as its previous one ends;
    its runs see ``CUDA_VISIBLE_DEVICES=<entry>``.
    """
    if not devices:
        raise ValueError("run_queue needs at least one device")
    check_one_run_per_folder(chains)
    todo: "queue.SimpleQueue[Chain]" = queue.SimpleQueue()
    for chain in chains:
        todo.put(chain)
    outcomes: List[Outcome] = []
    lock = threading.Lock()
    errors: List[BaseException] = []

    def worker(slot: int, device: str) -> None:
        label = f"gpu {device}" if devices.count(device) == 1 else f"gpu {device}#{slot}"
        while True:
            try:
                chain = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done = execute_chain(chain, launcher, {"CUDA_VISIBLE_DEVICES": device}, report, label)
            except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread)
                errors.append(exc)
                return
            with lock:
                outcomes.extend(done)

    slots = [devices[:i].count(d) for i, d in enumerate(devices)]
    threads = [threading.Thread(target=worker, args=(slot, device), daemon=True)
               for slot, device in zip(slots, devices)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return outcomes


@dataclass
class SlurmOptions:
    """Resources of each job (one chain per job) and where submitit keeps its files.

    ``cluster`` None lets submitit pick Slurm when ``sbatch`` exists; "local" runs the jobs
    as local processes and "debug" in this process (both for testing the submission path).
    ``additional`` holds extra ``#SBATCH`` options (name -> value, e.g. {"exclude": "node3"}).
    """

    folder: str
    cluster: Optional[str] = None
    job_name: str = "vlprompt"
    timeout_min: int = 24 * 60
    gpus_per_node: int = 1
    cpus_per_task: int = 8
    mem_gb: Optional[int] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    array_parallelism: int = 256
    additional: Dict[str, str] = field(default_factory=dict)


def _import_submitit():
    try:
        import submitit
    except ImportError:
        raise ImportError(
            "The Slurm backend needs submitit, an optional dependency: "
            'pip install -e ".[slurm]" (or pip install submitit).') from None
    return submitit


def run_chain_job(chain: Chain, launcher: Launcher) -> List[Outcome]:
    """The function each Slurm job runs: the chain, in the submitting directory."""
    os.chdir(launcher.cwd)
    return execute_chain(chain, launcher, {}, where=f"job {os.environ.get('SLURM_JOB_ID', os.getpid())}")


def submit_slurm(chains: Sequence[Chain], launcher: Launcher, options: SlurmOptions) -> list:
    """Submit one job per chain as a job array; return the submitit jobs (same order)."""
    check_one_run_per_folder(chains)
    submitit = _import_submitit()
    executor = submitit.AutoExecutor(folder=options.folder, cluster=options.cluster)
    parameters = dict(name=options.job_name, timeout_min=options.timeout_min,
                      gpus_per_node=options.gpus_per_node, cpus_per_task=options.cpus_per_task,
                      slurm_array_parallelism=options.array_parallelism)
    if options.mem_gb is not None:
        parameters["mem_gb"] = options.mem_gb
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(options, key) is not None:
            parameters[f"slurm_{key}"] = getattr(options, key)
    if options.additional:
        parameters["slurm_additional_parameters"] = dict(options.additional)
    executor.update_parameters(**parameters)
    return executor.map_array(run_chain_job, list(chains), [launcher] * len(chains))


def wait_for_jobs(jobs: Sequence, chains: Sequence[Chain],
                  report: Optional[Callable[[Outcome], None]] = None,
                  poll_seconds: float = 30.0) -> List[Outcome]:
    """Wait for every job; a job that died (timeout, node failure) fails its unfinished runs."""
    submitit = _import_submitit()
    chain_of = {job.job_id: chain for job, chain in zip(jobs, chains)}
    outcomes: List[Outcome] = []
    for job in submitit.helpers.as_completed(list(jobs), poll_frequency=poll_seconds):
        try:
            done = job.result()
        except Exception as exc:  # noqa: BLE001  (job-level failure)
            reason = str(exc).strip().splitlines()
            detail = f"job {job.job_id} failed: {reason[-1] if reason else type(exc).__name__}"
            done = [Outcome(run, SKIPPED if is_completed(run.output_dir) else FAILED,
                            detail=f"{detail} (see {job.paths.stderr})", where=f"job {job.job_id}")
                    for run in chain_of[job.job_id].runs]
        for outcome in done:
            if report is not None:
                report(outcome)
        outcomes.extend(done)
    return outcomes


def summarize(outcomes: Sequence[Outcome], stream: Optional[TextIO] = None) -> int:
    """Print the counts and every failed, blocked or held run; return 0 if none, else 1.

    A held run that the process holding it has completed by now is no longer a problem.
    """
    out = stream or sys.stdout
    counts = {status: sum(o.status == status for o in outcomes)
              for status in (OK, FAILED, BLOCKED, SKIPPED, HELD)}
    held = [o for o in outcomes if o.status == HELD]
    held_done = sum(is_completed(o.run.output_dir) for o in held)
    held_part = (f", {counts[HELD]} held by another process ({held_done} of them completed there)" if held else "")
    print(f"Finished: {counts[OK]} ok, {counts[FAILED]} failed, {counts[BLOCKED]} blocked "
          f"(their training run failed), {counts[SKIPPED]} already completed{held_part}.", file=out)
    problems = sorted((o for o in outcomes if o.status in (FAILED, BLOCKED)
                       or (o.status == HELD and not is_completed(o.run.output_dir))),
                      key=lambda o: o.run.label)
    if problems:
        print("Runs that did not complete:", file=out)
        for outcome in problems:
            print(f"  {outcome.status:<7} {outcome.run.label}\n          {outcome.detail}", file=out)
        if any(o.status != HELD for o in problems):
            print("Fix the cause and run the same command again: completed runs are skipped.", file=out)
        if any(o.status == HELD for o in problems):
            print("Held runs are being run by the process named: run the same command again once it has ended.",
                  file=out)
    return 1 if problems else 0
