"""``tools/gpu_acceptance.py run``: the GPU acceptance run, stage after stage within a time budget.

Stages (each in its own process, its output in ``OUT/logs/<stage>.log``):

1. ``environment``: the machine, torch, CUDA and the carried packages (``environment.json``).
2. ``cuda-tests`` and ``parity``, side by side (neither is timed): the tests marked ``gpu``
   (``pytest -m gpu`` over the test files that mark any), and CUDA against CPU outputs of every
   benchmark case on the tiny CLIP (``parity.jsonl``).
3. ``official``: ``tools/benchmark.py official``'s measurement for the methods whose cost spec
   says ``gpu_acceptance`` (``official_methods``), both sides on the device in their recipes'
   precision (``official.jsonl`` as each method is measured, ``official.json`` at the end);
   skipped, with the reason, when ``--official`` names no exported trees.
4. ``trainers``: every benchmark case's training step and evaluation at the papers' settings
   (``trainers.jsonl``), with the time left.

A stage that outlives its share of the budget is stopped and the run goes on; the report
(``acceptance.json``, ``acceptance.md``) says so. ``--rehearsal`` runs the same stages on the CPU
with tiny settings (the tiny CLIP, 4 classes, small batches, a few cases) so that the script is
exercised where no GPU is.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from vlprompt.paths import repository_root

from .report import write_report

CARRIED_FOLDER = ".gpu"  # what prepare fills by default (git-ignored), relative to the repository
DASSL_FOLDER = "dassl"  # the exported Dassl.pytorch under --official, beside owner+name folders
GPU_SETTINGS = {  # the papers' settings: train batch 16, evaluation batch 250 (DeAR's supplement), 1000 classes
    "batch": 16, "eval_batch": 250, "classes": 1000, "image_size": 224, "device": "cuda", "prec": "amp",
    "threads": 0, "rounds": 3, "warmup": 1, "clock": "wall", "backbone": "ViT-B/16", "weights": "random",
    "opts": [], "cases": [],
}
REHEARSAL_CASES = ["CoOp", "DeAR", "RAda", "TPT"]
REHEARSAL_SETTINGS = dict(GPU_SETTINGS, batch=2, eval_batch=4, classes=4, image_size=32, device="cpu", threads=2,
                          rounds=1, warmup=0, backbone="configs/clip/tiny-synthetic-clip.json", tiny_configs=True,
                          cases=REHEARSAL_CASES)
# the share of the budget each stage may take at most (the trainers stage takes what is left)
SHARES = {"environment": 0.1, "cuda-tests": 0.3, "parity": 0.3, "official": 0.5}


class Stage:
    """One stage's process: its command, log file and deadline."""

    def __init__(self, name, command, out_dir, seconds):
        self.name, self.command, self.seconds = name, command, seconds
        os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
        self.log_path = os.path.join(out_dir, "logs", f"{name}.log")
        self.started = time.monotonic()
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=str(repository_root()),
                                            env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def wait(self):
        """{"stage", "command", "seconds", "exit_status" (None: stopped at its limit), "stopped"}."""
        try:
            status = self.process.wait(timeout=max(1.0, self.seconds - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            status = None
        return {"stage": self.name, "command": " ".join(self.command), "seconds": time.monotonic() - self.started,
                "exit_status": status, "stopped": status is None, "limit_s": self.seconds}


def stage_command(stage, out_dir, settings):
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


def official_argv(settings, given, dassl):
    """``tools/benchmark.py official``'s options for ``official_methods()``: on CUDA each side in its
    recipe's precision; on the CPU (the rehearsal) in fp32, without the methods that run only in
    their recipe's."""
    from vlprompt_app.fidelity.methods import METHODS

    cuda = settings["device"] == "cuda"
    methods = [method for method in official_methods() if cuda or not METHODS[method].cost.recipe_only]
    argv = ["--methods", *methods, "--device", settings["device"], "--prec", "recipe" if cuda else "fp32",
            "--batch", str(settings["batch"]), "--classes", str(settings["classes"]),
            "--rounds", str(settings["rounds"]), "--warmup", str(settings["warmup"]),
            "--threads", str(settings["threads"] or os.cpu_count())]
    for item in given:
        argv += ["--official-git", item]
    return argv + (["--dassl-git", dassl] if dassl else [])


STAGES = ("environment", "cuda-tests", "parity", "official", "trainers")


def run(out_dir, official=None, rehearsal=False, budget_s=330.0, stages=STAGES, cases=()):
    """Run the ``stages`` (the environment always) into ``out_dir`` within ``budget_s`` seconds, the
    parity and trainers stages over ``cases`` (case or trainer names; default: the settings');
    returns the report dict."""
    start = time.monotonic()
    settings = dict(REHEARSAL_SETTINGS if rehearsal else GPU_SETTINGS)
    if cases:
        settings["cases"] = list(cases)
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; the stages are {list(STAGES)}")
    os.makedirs(out_dir, exist_ok=True)
    for stale in ("parity.jsonl", "trainers.jsonl", "official.jsonl", "official.json"):
        if os.path.exists(os.path.join(out_dir, stale)):
            os.remove(os.path.join(out_dir, stale))

    def limit(share):
        return max(5.0, min(share * budget_s, budget_s - (time.monotonic() - start)))

    selected = set(stages)

    def not_selected(name):
        return {"stage": name, "skipped": "not selected (--stages)"}

    done = [Stage("environment", stage_command("environment", out_dir, settings), out_dir,
                  limit(SHARES["environment"])).wait()]
    side_by_side = []  # neither is timed: they run at once
    if "cuda-tests" in selected:
        side_by_side.append(Stage("cuda-tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                                                 "no:cacheprovider", "-o", "addopts=", *gpu_test_files()],
                                  out_dir, limit(SHARES["cuda-tests"])))
    if "parity" in selected:
        side_by_side.append(Stage("parity", stage_command("parity", out_dir, settings), out_dir,
                                  limit(SHARES["parity"])))
    waited = {stage.name: stage.wait() for stage in side_by_side}
    done += [waited.get(name) or not_selected(name) for name in ("cuda-tests", "parity")]
    given, dassl = official_trees(official)
    if "official" not in selected:
        done.append(not_selected("official"))
    elif given:
        official_settings = dict(settings, official_argv=official_argv(settings, given, dassl))
        done.append(Stage("official", stage_command("official", out_dir, official_settings), out_dir,
                          limit(SHARES["official"])).wait())
    else:
        done.append({"stage": "official", "skipped": f"no exported official trees under {official!r} "
                     "(tools/gpu_acceptance.py prepare writes them)"})
    if "trainers" in selected:
        done.append(Stage("trainers", stage_command("trainers", out_dir, settings), out_dir, limit(1.0)).wait())
    else:
        done.append(not_selected("trainers"))
    report = write_report(out_dir, settings, done, time.monotonic() - start, recorded_commit())
    _gather_logs(out_dir)
    return report


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
