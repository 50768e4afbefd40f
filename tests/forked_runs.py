"""Runs in processes forked from a forkserver that imported torch, open_clip and the engine once:
runs killed with SIGKILL at chosen points (the kill and resume tests of train.py and of
tools/run_protocol.py), ``run_script``, a ``python script.py ...`` command run without
starting an interpreter (the command-line tests of train.py), ``run_module``, the same for a
``python -m module ...`` command, and ``run_ranks``, the processes of one torch.distributed job
(the multi-process tests of train.py).
"""
import multiprocessing
import os
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import forkserver
from pathlib import Path

from vlprompt.paths import repository_root
from vlprompt_app.project import PROJECT_PACKAGES

ROOT = Path(__file__).resolve().parents[1]


# What a forked train.py or run_protocol.py run imports: vlprompt_app.commands.* import torch and
# the engine only when they run, so the forkserver names the heavy modules itself, and the
# project's trainers and datasets, which every run imports (vlprompt_app.project), as
# ``python train.py`` finds them: in the repository root, first on the forkserver's sys.path (it
# runs with the interpreter's default sys.path and the PYTHONPATH it is started with, not tests/).
# And pytest: a process target defined in a test module (launch) is unpickled in each child by
# importing that module, which imports pytest (~0.1 s of CPU per run otherwise).
PRELOAD = ["torch", "torchvision", "vlprompt.clip", "open_clip", "vlprompt.engine", "vlprompt.data.datasets",
           "vlprompt.evaluation", "vlprompt_app.commands.train", "vlprompt_app.commands.run_protocol",
           *PROJECT_PACKAGES, "pytest"]


def forkserver_context():
    """A forkserver that imports torch, open_clip, the engine and the project's packages once for
    all forked runs, started now (with the repository root first on its PYTHONPATH) unless it runs."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(repository_root()), *([pythonpath] if pythonpath else [])])
    try:
        forkserver.ensure_running()
    finally:
        if pythonpath is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = pythonpath
    return context


def enter_child():
    """In a forked run: silence its output and work from the repository root."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.chdir(ROOT)


def launch(context, target, argv, kill=None):
    """Run ``target(argv, kill)`` in a forked process; return (exit code, seconds). A kill
    ("time", seconds) is sent from here after that delay; any other kill is the target's to arm."""
    start = time.time()
    process = context.Process(target=target, args=(argv, kill))
    process.start()
    if kill is not None and kill[0] == "time":
        process.join(kill[1])
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
    process.join(600)
    return process.exitcode, time.time() - start


_CONTEXT = []


def _script_child(script, args, cwd, env, stdout_path, stderr_path, new_session):
    """Process target: ``script`` as ``__main__`` with ``args``, from ``cwd`` with ``env``, its
    standard output and error written to the two files (one file when they are the same path), as
    ``python script args`` would run it (unbuffered when ``env`` sets PYTHONUNBUFFERED)."""
    if new_session:
        os.setsid()
    outputs = [stdout_path] if stderr_path == stdout_path else [stdout_path, stderr_path]
    for fd, path in zip((1, 2), outputs):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    if len(outputs) == 1:
        os.dup2(1, 2)
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if env.get("OMP_NUM_THREADS", "").isdigit():  # what a new interpreter's torch would read at import
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")  # sys.path is the test process's: the scripts import installed packages


class ForkedScript:
    """The command ``[sys.executable, script.py, *args]`` started in a process forked from this test
    process's forkserver instead of a new interpreter, with ``subprocess.Popen``'s ``pid``, ``poll``,
    ``wait`` and ``returncode``. The script runs as ``__main__`` with its argv, from ``cwd``, with
    ``env`` (default: this process's environment), its outputs written to ``stdout_path`` and
    ``stderr_path`` (the same path: one stream, as ``stderr=STDOUT``), in a session of its own when
    ``new_session`` (its process group is then its own). Its exit status is the script's
    (``sys.exit`` code; 1 with the traceback on standard error for an uncaught exception; minus the
    signal when killed). What it saves is the interpreter start and the imports of torch, torchvision
    and open_clip, about 6-8 s of CPU per command on the developers' machine; tests of the
    interpreter's own behaviour (a command typed in a shell, PYTHONPATH, sys.path from the working
    directory) start real processes instead."""

    def __init__(self, command, stdout_path, stderr_path, cwd=ROOT, env=None, new_session=False):
        executable, script, *args = command
        if executable != sys.executable or not str(script).endswith(".py"):
            raise ValueError(f"a forked script runs [sys.executable, script.py, ...], got {command[:2]}")
        if not _CONTEXT:
            _CONTEXT.append(forkserver_context())
        self.args = command
        for path in {str(stdout_path), str(stderr_path)}:  # they exist once the command is started, as with Popen
            open(path, "w").close()
        self._process = _CONTEXT[0].Process(target=_script_child, args=(
            os.path.join(cwd, script), list(map(str, args)), str(cwd), dict(os.environ if env is None else env),
            str(stdout_path), str(stderr_path), new_session))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self):
        return self._process.exitcode

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode


def run_script(command, cwd=ROOT, env=None, timeout=300):
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``
    for ``command`` = [sys.executable, script.py, *args], run as a :class:`ForkedScript`."""
    with tempfile.TemporaryDirectory() as folder:
        stdout_path, stderr_path = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        process = ForkedScript(command, stdout_path, stderr_path, cwd=cwd, env=env)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            raise
        outputs = [Path(path).read_text(errors="replace") for path in (stdout_path, stderr_path)]
    return subprocess.CompletedProcess(command, process.returncode, *outputs)


def run_module(command, check=False, cwd=ROOT, env=None, timeout=300, **kwargs):
    """A stand-in for ``subprocess.run(command, capture_output=True, text=True, check=check, cwd=cwd, env=env)``
    for ``command`` = [sys.executable, "-m", module, *args], which a test sets as the ``subprocess.run`` that a
    project module starting ``python -m`` processes of its own calls: the module's file runs as ``__main__``
    in a :func:`run_script` process (so its imports must be absolute, as the project's are)."""
    import importlib.util

    executable, flag, module, *args = command
    if flag != "-m" or kwargs != {"capture_output": True, "text": True}:
        raise ValueError(f"a forked module runs [sys.executable, '-m', module, ...] with its output captured as text, "
                         f"got {command[:3]} {kwargs}")
    done = run_script([executable, importlib.util.find_spec(module).origin, *args], cwd=cwd, env=env, timeout=timeout)
    done.args = command
    if check:
        done.check_returncode()
    return done


def run_commands(script, cwd=ROOT, env=None, timeout=900):
    """A shell script of ``python script.py ...`` commands (a README code block: one command per
    line, ``\\`` continuations, ``#`` comments) run as ``bash -e`` runs it, each command a
    :func:`run_script`: in order, stopping at the first that fails; a CompletedProcess with the
    concatenated standard output and error and the failing (else last) command's exit status.
    Any other command, or shell syntax beyond words and quotes, is refused (ValueError): such a
    script needs a real shell."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # operators become words of their own
        lexer.whitespace_split = True
        words = list(lexer)
        if (words[0] != "python" or len(words) < 2 or not words[1].endswith(".py")
                or any(set(word) <= set(lexer.punctuation_chars) or "$" in word or "`" in word for word in words)):
            raise ValueError(f"not a plain 'python script.py ...' command: {line}")
        commands.append([sys.executable, *words[1:]])
    stdout, stderr, status = [], [], 0
    for command in commands:
        done = run_script(command, cwd=cwd, env=env, timeout=timeout)
        stdout.append(done.stdout)
        stderr.append(done.stderr)
        status = done.returncode
        if status != 0:
            break
    return subprocess.CompletedProcess(script, status, "".join(stdout), "".join(stderr))


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(command, world_size, output_prefix, cwd=ROOT, timeout=600):
    """``command`` = [sys.executable, script.py, *args] as the ``world_size`` processes of one
    torch.distributed job, each a :class:`ForkedScript` with the variables torchrun gives its
    workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, and MASTER_ADDR, MASTER_PORT: a free
    local port) and one torch thread; process r writes its output to ``<output_prefix>-rank<r>.txt``.
    Returns the outputs (text) once every process has ended; each must end with exit status 0."""
    port = str(free_port())
    outputs = [Path(f"{output_prefix}-rank{rank}.txt") for rank in range(world_size)]
    processes = [
        ForkedScript(command, output, output, cwd=cwd, env={
            **os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1"})
        for rank, output in enumerate(outputs)
    ]
    try:
        codes = [process.wait(timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
    texts = [output.read_text(errors="replace") for output in outputs]
    for rank, (code, text) in enumerate(zip(codes, texts)):
        assert code == 0, f"rank {rank} of {world_size} ended with exit status {code}:\n{text[-3000:]}"
    return texts
