"""The stages of the GPU acceptance run that measure project code, each run in its own process and
writing its own JSON (the data stages: :mod:`vlprompt_app.gpu_acceptance.data`).

    python -m vlprompt_app.gpu_acceptance.stages STAGE OUT_DIR SETTINGS_JSON

* ``environment``: Python, torch, CUDA, the GPU and the versions of the carried packages.
* ``parity``: CUDA against CPU outputs of every benchmark case on the tiny CLIP
  (:mod:`vlprompt_app.gpu_acceptance.parity`), one JSON line per case in ``parity.jsonl``.
* ``trainers``: every benchmark case's training step and evaluation (the per-trainer benchmark's
  ``measure_case``: images/s, peak memory, cost ratios, and with ``flops`` in the settings the
  FLOPs of each call and the fraction of the matmul peak measured in the same process) at the
  given settings, one JSON line per case in ``trainers.jsonl`` as soon as it is measured, so a
  stage stopped at its time limit keeps what it measured. CoCoOp's case comes first (its
  evaluation encodes batch x classes prompts: at 1000 classes and evaluation batch 250 the
  costliest), then those of ``FIRST_CASES``. A case that fails, or runs past ``case_limit_s``
  (``time_limit``), becomes an error record and the stage goes on. With ``tiny_configs`` in the
  settings (the rehearsal's tiny CLIP) each case takes its synthetic config.
* ``compiled``: each case of ``compile_cases`` (all when empty) measured in this process with the
  per-trainer benchmark's ``--compile`` at ``compile_backend`` (eager and compiled calls in the
  same rounds), each under ``case_limit_s``, one JSON line per case in ``compiled.jsonl``.
* ``official``: ``tools/benchmark.py official``'s measurement (ours against the official code), one
  JSON line per method in ``official.jsonl`` as soon as it is measured, the report in ``official.json``.

The CUDA-only tests run through pytest (``-m gpu``); :mod:`vlprompt_app.gpu_acceptance.run`
starts every stage and writes the report.
"""
import contextlib
import gc
import json
import os
import platform
import signal
import sys
import traceback

import torch

# the cases measured first by the trainers and compiled stages: those compared with their official
# code, then DeAR (the others follow in the registry's order)
FIRST_CASES = ("CoOp", "MaPLe", "PromptSRC", "MMRL", "DeAR")


def _append(path, record):
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _error_record(case):
    lines = traceback.format_exc().strip().splitlines()
    return {"case": case.name, "trainer": case.trainer, "error": lines[-12:]}


def _release(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def environment(out_dir, settings):
    """{python, torch, cuda, gpu, packages} of this machine."""
    from importlib import metadata

    packages = {}
    for name in ("torch", "torchvision", "open_clip_torch", "ftfy", "wcwidth", "yacs", "timm", "numpy", "pillow"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    cuda = torch.cuda.is_available()
    record = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cuda_available": cuda, "gpu": torch.cuda.get_device_name() if cuda else None,
              "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
              "cpu_count": os.cpu_count(), "packages": packages}
    with open(os.path.join(out_dir, "environment.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)


def parity(out_dir, settings):
    """parity.jsonl: one record per case (see :func:`vlprompt_app.gpu_acceptance.parity.compare_case`)."""
    from vlprompt_app.benchmarking.trainer_cases import select_cases
    from vlprompt_app.gpu_acceptance.parity import compare_case

    device = torch.device(settings["device"])
    path = os.path.join(out_dir, "parity.jsonl")
    for case in select_cases(settings["cases"]):
        try:
            record = compare_case(case, device)
        except Exception:
            record = _error_record(case)
        _append(path, record)
        print(json.dumps(record), flush=True)
        _release(device)


def ordered_cases(names, settings, first):
    """The cases of ``names`` (all when empty), the cases named in ``first`` first (in its order),
    then in the registry's order; each case's synthetic config with ``tiny_configs`` in the
    settings (the rehearsal's tiny CLIP)."""
    from vlprompt_app.benchmarking.trainer_cases import select_cases
    from vlprompt_app.gpu_acceptance.parity import tiny_case

    first = tuple(first)
    cases = sorted(select_cases(names), key=lambda case: (first + (case.name,)).index(case.name))
    return [tiny_case(case) for case in cases] if settings.get("tiny_configs") else cases


class CaseStopped(Exception):
    """A case ran past its time limit (``case_limit_s``)."""


@contextlib.contextmanager
def time_limit(seconds):
    """Raise CaseStopped in this (the main) thread once ``seconds`` have passed (SIGALRM; a call in
    C code, e.g. a CUDA synchronisation, ends first)."""
    def expire(signum, frame):
        raise CaseStopped(f"stopped at its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def measured(case, settings):
    """The per-trainer benchmark's record of ``case`` at ``settings`` (without its rounds' times),
    or an error record: the case failed, or ran past ``settings["case_limit_s"]`` (then also
    ``"stopped": True``)."""
    from vlprompt_app.benchmarking.per_trainer import measure_case

    try:
        with time_limit(settings["case_limit_s"]):
            record = measure_case(case, settings)
        record.pop("rounds")
        return record
    except CaseStopped as stopped:
        return {"case": case.name, "trainer": case.trainer, "error": [str(stopped)], "stopped": True}
    except Exception:
        return _error_record(case)
    finally:
        _release(torch.device(settings["device"]))


def trainers(out_dir, settings):
    """trainers.jsonl: the per-trainer benchmark's record of every case at ``settings``, CoCoOp's
    first (its evaluation, batch x classes prompts, was the one left unmeasured when it came last)."""
    from vlprompt_app.benchmarking.per_trainer import progress_line
    from vlprompt_app.benchmarking.trainer_cases import check_coverage, project_trainers

    check_coverage(project_trainers())
    path = os.path.join(out_dir, "trainers.jsonl")
    for case in ordered_cases(settings["cases"], settings, ("CoCoOp",) + FIRST_CASES):
        record = measured(case, settings)
        _append(path, record)
        print(progress_line(record), flush=True)


def compiled_sides(record):
    """{"case", "trainer", "eager", "compiled"} from a per-trainer record measured with
    ``compile``: each side {"train": {"wall_ms", "images_per_s"} or None, "eval": {"wall_ms",
    "images_per_s"}} from the medians of the same interleaved rounds; an error record gives both
    sides its error. (A trainer that refuses compiling is not measured: ``compiled`` records it.)"""
    head = {"case": record["case"], "trainer": record["trainer"]}
    if "error" in record:
        return dict(head, eager={"error": record["error"]}, compiled={"error": record["error"]})
    info = record["compile"]

    def side(kind):
        return {part: None if part not in info else
                {"wall_ms": info[part][f"{kind}_ms"],
                 "images_per_s": record[part]["images"] / info[part][f"{kind}_ms"] * 1000}
                for part in ("train", "eval")}

    return dict(head, eager=side("eager"), compiled=side("compiled"), backend=info.get("backend"),
                compile_s=info.get("compile_s"), graphs=info.get("graphs"), graph_breaks=info.get("graph_breaks"))


def compiled(out_dir, settings):
    """compiled.jsonl: per case of ``compile_cases`` (all when empty) the per-trainer benchmark's
    ``--compile settings["compile_backend"]`` measurement (eager and compiled calls interleaved in
    the same rounds on one trainer, without FLOPs) as its two sides (compiled_sides); a trainer
    whose class refuses TRAIN.COMPILE is recorded with its reason without being built."""
    from vlprompt_app.benchmarking.per_trainer import progress_line

    from vlprompt.engine import TRAINER_REGISTRY

    with_compile = dict(settings, flops=False, compile=settings["compile_backend"])
    path = os.path.join(out_dir, "compiled.jsonl")
    for case in ordered_cases(settings["compile_cases"], settings, FIRST_CASES):
        refusal = TRAINER_REGISTRY.get(case.trainer).compile_refusal
        if refusal:  # known from the class: no device time spent building it
            _append(path, {"case": case.name, "trainer": case.trainer, "refused": refusal})
            print(f"{case.name}: refuses TRAIN.COMPILE", flush=True)
            continue
        record = measured(case, with_compile)
        print(progress_line(record), flush=True)
        _append(path, compiled_sides(record))


def official(out_dir, settings):
    """official.jsonl: one record per method of ``settings["official_argv"]`` (``tools/benchmark.py
    official``'s options) as soon as it is measured; official.json: the whole report at the end."""
    import argparse

    from vlprompt_app.benchmarking.report import finish_report, start_report, write_report
    from vlprompt_app.fidelity import cost

    parser = argparse.ArgumentParser()
    cost.add_arguments(parser)
    parser.add_argument("--clock", default="wall")
    args = parser.parse_args(settings["official_argv"])
    path = os.path.join(out_dir, "official.jsonl")
    report = start_report("official")

    def progress(record):
        _append(path, record)
        print(json.dumps(record), flush=True)

    measured_settings, records = cost.measure(args, on_record=progress)
    write_report(finish_report(report, measured_settings, records), os.path.join(out_dir, "official.json"))


STAGES = {"environment": environment, "parity": parity, "official": official, "trainers": trainers,
          "compiled": compiled}


def main(argv):
    stage, out_dir, settings = argv
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")
    STAGES[stage](out_dir, json.loads(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
