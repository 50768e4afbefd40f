"""``tools/gpu_acceptance.py run``: the GPU acceptance run, stage after stage within a time budget.

Stages (each in its own process and process group, its output in ``OUT/logs/<stage>.log``), in steps:

1. ``environment``: the machine, torch, CUDA and the carried packages (``environment.json``).
2. Side by side (none of them is timed): ``cuda-tests``, the tests marked ``gpu`` (``pytest -m
   gpu`` over the test files that mark any; each test's outcome in ``cuda-tests.xml``, so the
   report names TAC's); ``parity``, CUDA against CPU outputs of every benchmark case on the tiny
   CLIP (``parity.jsonl``); ``data-tree``, the real-size data stage's ImageNet-layout tree of
   photo-sized JPEGs, written by one process per CPU into a folder outside OUT
   (:mod:`vlprompt_app.gpu_acceptance.data`; ``data_tree.json``).
3. ``data``: a whole DeAR base-to-novel chain (train, test base, test new) from that tree through
   ``tools/run_protocol.py``, with the time each step waits for its batch (``data.jsonl``).
4. ``official``: ``tools/benchmark.py official``'s measurement for the methods whose cost spec
   says ``gpu_acceptance`` (``official_methods``) and whose official tree ``--official`` holds, both
   sides on the device in their recipes' precision and batch, time and peak memory
   (``official.jsonl`` as each method is measured, ``official.json`` at the end); a method without
   its tree is reported as not available, the stage skipped when none has one.
5. ``trainers``: every benchmark case's training step and evaluation at the papers' settings, with
   their FLOPs and the fraction of the measured matmul peak (``trainers.jsonl``); CoCoOp's first
   (its evaluation encodes batch x classes prompts: at 1000 classes and evaluation batch 250 the
   costliest), each case within ``case_limit_s``.
6. ``compiled``: every case eager and compiled, interleaved in the same rounds (the per-trainer
   benchmark's ``--compile``, with TRAIN.COMPILE's ``inductor`` backend, CUDA graphs on CUDA; the
   rehearsal's ``eager`` backend traces without generating code) (``compiled.jsonl``).

Each step may run until its share of the budget (``DEADLINES``, cumulative: a step that ends early
leaves its time to the next; the last step that runs takes what is left); a stage still running
then is stopped with its process group, the run goes on, and the report (``acceptance.json``,
``acceptance.md``) says so. Every stage writes its records as it measures them, so a stopped stage
keeps what it measured. ``--rehearsal`` runs the same stages on the CPU with tiny settings (the
tiny CLIP, 4 classes, small batches, a few cases, a 4-class tree of small JPEGs) so that the
script is exercised where no GPU is. There each stage's command runs in a process forked from the
run's process, which imported torch, open_clip and the methods once (``REHEARSAL_PRELOAD``), as
``python -m MODULE ARGS`` would run it (:class:`ForkedCommand`): starting an interpreter and
importing them is most of a tiny stage's CPU time (pytest, in the CUDA-only tests' stage, then
notes that anyio, which open_clip imports, was imported before its plugin). On the GPU each stage
is a new interpreter (a forked CUDA state would be unusable).
"""
import gc
import importlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from vlprompt.paths import repository_root

from .report import write_report

CARRIED_FOLDER = ".gpu"  # what prepare fills by default (git-ignored), relative to the repository
DASSL_FOLDER = "dassl"  # the exported Dassl.pytorch under --official, beside owner+name folders
GPU_SETTINGS = {  # the papers' settings: train batch 16, evaluation batch 250 (DeAR's supplement), 1000 classes
    "batch": 16, "eval_batch": 250, "classes": 1000, "image_size": 224, "device": "cuda", "prec": "amp",
    "threads": 0, "rounds": 3, "warmup": 1, "clock": "wall", "backbone": "ViT-B/16", "weights": "random",
    "opts": [], "cases": [], "compile_cases": [], "compile_backend": "inductor", "case_limit_s": 60, "flops": True, "peak_size": 8192,
    "peak_repeats": 10,
    "official_batch": 0, "official_side_limit_s": 45,  # each method's recipe batch; seconds per side's process
    "data": {"root": os.path.join(tempfile.gettempdir(), "vlprompt_gpu_acceptance_data"), "classes": 1000,
             "train_per_class": 16, "val_per_class": 6, "size": [500, 375], "method": "DeAR:vit_b16_base2new",
             "shots": 16, "seed": 1, "workers": 0, "opts": ["OPTIM.MAX_EPOCH", "1", "MODEL.BACKBONE.WEIGHTS", "random"]},
}
REHEARSAL_CASES = ["CoCoOp", "CoOp", "DeAR", "RAda", "TPT"]
REHEARSAL_SETTINGS = dict(GPU_SETTINGS, batch=2, eval_batch=4, classes=4, image_size=32, device="cpu", threads=1,
                          rounds=1, warmup=0, backbone="configs/clip/tiny-synthetic-clip.json", tiny_configs=True,
                          cases=REHEARSAL_CASES, compile_cases=["CoOp", "CoCoOp+TPT"], compile_backend="eager", peak_size=128, peak_repeats=2,
                          official_batch=2,
                          data=dict(GPU_SETTINGS["data"], root=None, classes=4, train_per_class=16, val_per_class=2,
                                    size=[64, 48], method="DeAR:synthetic", workers=1,
                                    opts=["OPTIM.MAX_EPOCH", "1", "DATALOADER.TRAIN_X.BATCH_SIZE", "8"]))
# the steps in order; the stages of a step run side by side
STEPS = (("environment",), ("cuda-tests", "parity", "data-tree"), ("data",), ("official",), ("trainers",),
         ("compiled",))
STAGES = tuple(stage for step in STEPS for stage in step)
# the share of the budget by which each step ends (named by its first stage; the last step that runs: the end)
DEADLINES = {"environment": 0.05, "cuda-tests": 0.25, "data": 0.4, "official": 0.7, "trainers": 0.87,
             "compiled": 1.0}
OUTPUTS = ("parity.jsonl", "trainers.jsonl", "compiled.jsonl", "official.jsonl", "official.json", "data.jsonl",
           "data_tree.json", "cuda-tests.xml")


# What the rehearsal's run process imports before forking its stages (see ForkedCommand): the
# third-party packages and the project modules the stages import; the project's trainers too.
REHEARSAL_PRELOAD = ("torch", "torchvision", "open_clip", "pytest", "vlprompt.clip", "vlprompt.engine",
                     "vlprompt.data.datasets", "vlprompt.testing", "vlprompt_app.benchmarking.per_trainer",
                     "vlprompt_app.commands.train", "vlprompt_app.commands.run_protocol")


def preload_rehearsal():
    """Import REHEARSAL_PRELOAD and the project's trainers in this process (before forking stages),
    then freeze what is alive (``gc.freeze``): the stages' collections (one after each case, and
    those the allocations trigger) then walk only the objects made since, not the ~400,000 of
    these imports (about 0.2 s of CPU per full collection)."""
    from vlprompt_app.project import import_project_package

    for name in REHEARSAL_PRELOAD:
        importlib.import_module(name)
    import_project_package("trainers")
    gc.freeze()


class ForkedCommand:
    """``command`` (``[python, "-m", MODULE, *ARGS]``) run in a child forked from this process, in a
    session of its own, from ``cwd`` with ``environment``, its standard output and error written to
    ``log_path``: the module runs as ``__main__`` with its arguments as ``python -m`` runs it, its
    exit status the module's (``sys.exit`` code; 1 with the traceback for an uncaught exception).
    The rehearsal's stages run so (what this process imported is not imported again); ``pid`` and
    ``returncode`` as on a ``subprocess.Popen``."""

    def __init__(self, command, log_path, cwd, environment):
        executable, flag, module, *args = command
        if executable != sys.executable or flag != "-m":
            raise ValueError(f"a forked command is [sys.executable, '-m', MODULE, ...], got {command[:2]}")
        self.returncode = None
        self.pid = os.fork()
        if self.pid == 0:
            os._exit(self._child(module, args, log_path, cwd, environment))

    @staticmethod
    def _child(module, args, log_path, cwd, environment):
        status = 1
        try:
            os.setsid()
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            for fd in (1, 2):
                os.dup2(log, fd)
            os.close(log)
            sys.stdout.reconfigure(write_through=True)  # PYTHONUNBUFFERED, which only a new interpreter reads
            sys.stderr.reconfigure(write_through=True)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environment)
            if environment.get("OMP_NUM_THREADS", "").isdigit():  # what a new interpreter's torch reads at import
                import torch

                torch.set_num_threads(int(environment["OMP_NUM_THREADS"]))
            sys.argv = [module, *args]
            sys.modules.pop(module, None)  # run as in a new interpreter, where importing it later gives a second copy
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as stop:
            if isinstance(stop.code, int) or stop.code is None:
                status = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return status


class Stage:
    """One stage's process (in a process group of its own, so that stopping it also stops the
    processes it started): its command, log file and time limit; ``forked`` (the rehearsal) runs
    the command as a :class:`ForkedCommand` instead of a new interpreter."""

    def __init__(self, name, command, out_dir, seconds, threads=0, forked=False):
        self.name, self.command, self.seconds = name, command, seconds
        environment = dict(os.environ, PYTHONUNBUFFERED="1")
        if threads:  # the stage's torch and OpenMP threads (0: their defaults)
            environment["OMP_NUM_THREADS"] = str(threads)
        os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
        self.log_path = os.path.join(out_dir, "logs", f"{name}.log")
        self.started = time.monotonic()
        if forked:
            self.process = ForkedCommand(command, self.log_path, str(repository_root()), environment)
            return
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(repository_root()),
                                            env=environment, start_new_session=True)

    def wait(self):
        """{"stage", "command", "seconds", "cpu_s" (the process's and its waited-for children's CPU
        time), "exit_status" (None: stopped at its limit), "stopped", "limit_s"}."""
        pid, stopped = self.process.pid, False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - self.started >= self.seconds:
                os.killpg(pid, signal.SIGKILL)  # the stage and whatever it started
                done, status, usage = os.wait4(pid, 0)
                stopped = True
                break
            time.sleep(0.05)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        return {"stage": self.name, "command": " ".join(self.command), "seconds": time.monotonic() - self.started,
                "cpu_s": usage.ru_utime + usage.ru_stime, "exit_status": None if stopped else self.process.returncode,
                "stopped": stopped, "limit_s": self.seconds}


def stage_command(stage, out_dir, settings):
    if stage == "data-tree":  # the data module imports no torch for the tree
        return [sys.executable, "-m", "vlprompt_app.gpu_acceptance.data", "tree", out_dir, json.dumps(settings)]
    if stage == "data":
        return [sys.executable, "-m", "vlprompt_app.commands.gpu_acceptance_chain", out_dir, json.dumps(settings)]
    if stage == "cuda-tests":
        return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
                "--junitxml", os.path.join(out_dir, "cuda-tests.xml"), *gpu_test_files()]
    return [sys.executable, "-m", "vlprompt_app.gpu_acceptance.stages", stage, out_dir, json.dumps(settings)]


def gpu_test_files():
    """The test files that mark a test ``gpu`` (relative to the repository)."""
    tests = os.path.join(str(repository_root()), "tests")
    return sorted(f"tests/{name}" for name in os.listdir(tests)
                  if name.startswith("test_") and name.endswith(".py")
                  and "pytest.mark.gpu" in open(os.path.join(tests, name), encoding="utf-8").read())


def official_trees(folder):
    """(["OWNER/NAME=PATH", ...], Dassl path or None) of the exported trees under ``folder``."""
    if not folder or not os.path.isdir(folder):
        return [], None
    given = [f"{name.replace('+', '/', 1)}={os.path.join(folder, name)}" for name in sorted(os.listdir(folder))
             if "+" in name and os.path.isdir(os.path.join(folder, name))]
    dassl = os.path.join(folder, DASSL_FOLDER)
    return given, dassl if os.path.isdir(dassl) else None


def official_methods():
    """The GPU comparison's methods: those whose fidelity spec's cost says ``gpu_acceptance``
    (vlprompt_app/fidelity/methods/), in the order of METHODS."""
    from vlprompt_app.fidelity.methods import METHODS

    return [name for name, spec in METHODS.items() if spec.cost is not None and spec.cost.gpu_acceptance]


def official_plan(settings, given, dassl):
    """(the methods of ``official_methods()`` the official stage measures, {method: why it cannot}):
    a method needs its repository's exported tree in ``given`` (and Dassl's unless the tree holds
    its own fork); on the CPU (the rehearsal) it must also run in fp32."""
    from vlprompt_app.fidelity.methods import METHODS

    trees = {item.partition("=")[0] for item in given}
    measured, unavailable = [], {}
    for method in official_methods():
        spec = METHODS[method]
        if spec.repository not in trees:
            unavailable[method] = f"official code not available: no exported tree of {spec.repository}"
        elif spec.needs_dassl and not dassl:
            unavailable[method] = "official code not available: no exported Dassl.pytorch"
        elif settings["device"] != "cuda" and spec.cost.recipe_only:
            unavailable[method] = "its official step runs only in its recipe's precision (on CUDA)"
        else:
            measured.append(method)
    return measured, unavailable


def official_argv(settings, methods, given, dassl):
    """``tools/benchmark.py official``'s options for ``methods``: on CUDA each side in its recipe's
    precision; on the CPU (the rehearsal) in fp32; the batch ``settings["official_batch"]`` (0:
    each method's recipe batch); each side's process stopped after ``official_side_limit_s``, so
    that one that hangs leaves the stage's time to the other methods."""
    cuda = settings["device"] == "cuda"
    argv = ["--methods", *methods, "--device", settings["device"], "--prec", "recipe" if cuda else "fp32",
            "--batch", str(settings["official_batch"]), "--classes", str(settings["classes"]),
            "--rounds", str(settings["rounds"]), "--warmup", str(settings["warmup"]),
            "--threads", str(settings["threads"] or os.cpu_count()), "--side-limit", str(settings["official_side_limit_s"])]
    for item in given:
        argv += ["--official-git", item]
    return argv + (["--dassl-git", dassl] if dassl else [])


def run(out_dir, official=None, rehearsal=False, budget_s=330.0, stages=STAGES, cases=()):
    """Run the ``stages`` (the environment always) into ``out_dir`` within ``budget_s`` seconds, the
    parity, trainers and compiled stages over ``cases`` (case or trainer names; default: the
    settings'); returns the report dict."""
    start = time.monotonic()
    settings = json.loads(json.dumps(REHEARSAL_SETTINGS if rehearsal else GPU_SETTINGS))  # a deep copy
    if cases:
        settings["cases"] = settings["compile_cases"] = list(cases)
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; the stages are {list(STAGES)}")
    os.makedirs(out_dir, exist_ok=True)
    for stale in OUTPUTS:
        if os.path.exists(os.path.join(out_dir, stale)):
            os.remove(os.path.join(out_dir, stale))
    if rehearsal:
        preload_rehearsal()
    scratch = None
    if settings["data"]["root"] is None:  # the rehearsal's tree: a folder removed at the end
        scratch = settings["data"]["root"] = tempfile.mkdtemp(prefix="gpu_acceptance_data_")
    selected = set(stages) | {"environment"} | ({"data-tree"} if "data" in stages else set())  # data needs the tree
    given, dassl = official_trees(official)
    measured, unavailable = official_plan(settings, given, dassl)
    settings["official_argv"] = official_argv(settings, measured, given, dassl) if measured else None
    settings["official_unavailable"] = unavailable

    def skipped(name):
        """The reason ``name`` does not run (known before the run starts), or None."""
        if name not in selected:
            return "not selected (--stages)"
        if name == "official" and not measured:
            return (f"no exported official tree under {official!r} for {', '.join(unavailable)} "
                    "(tools/gpu_acceptance.py prepare writes them)")
        return None

    done = []
    try:
        for index, step in enumerate(STEPS):
            reasons = {name: skipped(name) for name in step}
            if "data" in reasons and not reasons["data"] and not _tree_written(out_dir):
                reasons["data"] = "the data-tree stage wrote no tree"
            later = [name for following in STEPS[index + 1:] for name in following if not skipped(name)]
            deadline = DEADLINES[step[0]] if later else 1.0  # the last step that runs takes what is left
            limit = max(5.0, deadline * budget_s - (time.monotonic() - start))
            running, outcomes = [], {}
            for name in step:
                if reasons[name]:
                    outcomes[name] = {"stage": name, "skipped": reasons[name]}
                else:
                    running.append(Stage(name, stage_command(name, out_dir, settings), out_dir, limit,
                                         settings["threads"], forked=rehearsal))
            outcomes.update({stage.name: stage.wait() for stage in running})
            done += [outcomes[name] for name in step]
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    report = write_report(out_dir, settings, done, time.monotonic() - start, recorded_commit())
    _gather_logs(out_dir)
    return report


def _tree_written(out_dir):
    return os.path.exists(os.path.join(out_dir, "data_tree.json"))


def recorded_commit():
    """The commit the run's tree came from: ``.gpu/commit`` (written by prepare), else git's."""
    from vlprompt_app.benchmarking.report import git_commit

    recorded = os.path.join(str(repository_root()), CARRIED_FOLDER, "commit")
    if os.path.exists(recorded):
        with open(recorded, encoding="utf-8") as f:
            return f.read().strip()
    return git_commit()


def _gather_logs(out_dir):
    """The stage logs into one ``logs.txt`` (the folder of logs is removed)."""
    folder = os.path.join(out_dir, "logs")
    with open(os.path.join(out_dir, "logs.txt"), "w", encoding="utf-8") as gathered:
        for name in sorted(os.listdir(folder)):
            gathered.write(f"===== {name}\n")
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as log:
                gathered.write(log.read())
    shutil.rmtree(folder)
