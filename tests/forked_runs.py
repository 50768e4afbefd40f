"""Runs in processes forked from a forkserver, killed with SIGKILL at chosen points (the kill and
resume tests of train.py and of tools/run_protocol.py)."""
import multiprocessing
import os
import signal
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# What a forked train.py or run_protocol.py run imports: vlprompt_app.commands.* import torch and
# the engine only when they run, so the forkserver names the heavy modules itself (it runs with
# the interpreter's default sys.path, hence installed modules only, not tests/).
PRELOAD = ["torch", "torchvision", "open_clip", "vlprompt.engine", "vlprompt.clip", "vlprompt.data.datasets",
           "vlprompt.evaluation", "vlprompt_app.commands.train", "vlprompt_app.commands.run_protocol"]


def forkserver_context():
    """A forkserver that imports torch, open_clip and the engine once for all forked runs."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
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
