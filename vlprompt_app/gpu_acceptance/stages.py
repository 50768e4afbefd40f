"""The stages of the GPU acceptance run, each run in its own process and writing its own JSON.

    python -m vlprompt_app.gpu_acceptance.stages STAGE OUT_DIR SETTINGS_JSON

* ``environment``: Python, torch, CUDA, the GPU and the versions of the carried packages.
* ``parity``: CUDA against CPU outputs of every benchmark case on the tiny CLIP
  (:mod:`vlprompt_app.gpu_acceptance.parity`), one JSON line per case in ``parity.jsonl``.
* ``trainers``: every benchmark case's training step and evaluation (the per-trainer benchmark's
  ``measure_case``: images/s, peak memory, cost ratios) at the given settings, one JSON line per
  case in ``trainers.jsonl`` as soon as it is measured, so a stage stopped at its time limit keeps
  what it measured; a case that fails becomes an error record and the stage goes on. With
  ``tiny_configs`` in the settings (the rehearsal's tiny CLIP) each case takes its synthetic config.

* ``official``: ``tools/benchmark.py official``'s measurement (ours against the official code), one
  JSON line per method in ``official.jsonl`` as soon as it is measured, the report in ``official.json``.

The CUDA-only tests run through pytest (``-m gpu``); :mod:`vlprompt_app.gpu_acceptance.run`
starts every stage and writes the report.
"""
import gc
import json
import os
import platform
import sys
import traceback

import torch


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


def trainers(out_dir, settings):
    """trainers.jsonl: the per-trainer benchmark's record of every case, at ``settings``."""
    from vlprompt_app.benchmarking.per_trainer import measure_case, progress_line
    from vlprompt_app.benchmarking.trainer_cases import check_coverage, project_trainers, select_cases
    from vlprompt_app.gpu_acceptance.parity import tiny_case

    check_coverage(project_trainers())
    device = torch.device(settings["device"])
    path = os.path.join(out_dir, "trainers.jsonl")
    # the cases whose evaluation encodes class text per image (CoCoOp) last: the costliest
    cases = sorted(select_cases(settings["cases"]), key=lambda case: case.trainer == "CoCoOp")
    if settings.get("tiny_configs"):  # the tiny CLIP: each case's synthetic config
        cases = [tiny_case(case) for case in cases]
    for case in cases:
        try:
            record = measure_case(case, settings)
            record.pop("rounds")
        except Exception:
            record = _error_record(case)
        _append(path, record)
        print(progress_line(record), flush=True)
        _release(device)


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


STAGES = {"environment": environment, "parity": parity, "official": official, "trainers": trainers}


def main(argv):
    stage, out_dir, settings = argv
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")
    STAGES[stage](out_dir, json.loads(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
