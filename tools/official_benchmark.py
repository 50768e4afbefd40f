"""``tools/benchmark.py official``: one training step of our trainers and of their official code,
side by side on the same random CLIP and the same batch.

For every method of tools/official_methods/ (or ``--methods``), two fresh processes, each timing
in interleaved rounds (median of ``--rounds`` after ``--warmup`` untimed ones) its training step
and its unit, a frozen CLIP image forward of the same batch without autograd:

* ours: the method's trainer (its case in vlprompt/benchmarking/trainer_cases.py, built through
  its own class from its config file with the spec's ``our_nodes`` set over it, fp32): the unit is
  ``encode_image_plain``; the step is ``set_model_mode("train")`` and ``forward_backward`` of the
  batch (forward, loss, backward, optimizer step on the trainable parameters of its recipe), as
  the engine calls them per batch;
* official: the official trainer class (the spec's ``official_trainer``) in a subprocess with
  the official tree and its Dassl fork first on ``PYTHONPATH``, set up by
  tools/official_equivalence.py's harness (stand-ins, ``clip._download`` pointed at the weights
  file, the spec's Dassl config) plus ``official_train_cfg`` and SGD; the trainer is made without
  its ``__init__`` (which builds a data loader): Dassl's model registry, then its own
  ``build_model`` (CLIP load, trainable parameters, optimizer; ``.cuda()`` is a no-op, as
  ProGrad's moves its zero-shot CLIP there) and, per step, ``set_model_mode("train")`` and its
  own ``forward_backward``. The official model is cast to fp32 after build_model (the official
  fp32 branch; MaPLe's coupling F_1 stays fp16 otherwise) and gets the spec's
  ``prepare_official_model``. The unit is the official clip package's CLIP (its ``build_model`` of
  the weights file, fp32) ``encode_image``.

Both sides read one weights file (tools/official_equivalence.py's seeded random CLIP), one batch
of ``--batch`` seeded random images with labels 0, 1, ... modulo ``--classes``, and the class
names "class number i" of the per-trainer benchmark. A side's cost ratio is its step over its
unit (same process, same rounds), so the two sides' ratios compare across processes and load;
"ours / official" is our cost ratio over the official one, which issue 18's contract wants at most
0.5 (flagged otherwise); the table also gives the quotient of the two steps' times alone and the
learnable parameters each side's optimizer updates. Under ``--clock cpu`` both processes run with
OMP_WAIT_POLICY=PASSIVE (unless set), as the per-trainer family's do.

The subprocesses are this file run with ``--side ours|official WORKDIR METHOD``.
"""
import argparse
import contextlib
import inspect
import io
import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import torch

from vlprompt.fileio import atomic_write

import official_equivalence as oe  # tools/official_equivalence.py, next to this file

ROOT = oe.ROOT
WEIGHTS_SEED = oe.DEFAULT_SEEDS["weights"]
IMAGES_SEED = oe.DEFAULT_SEEDS["images"]
CONTRACT_RATIO = 0.5  # issue 18: our train cost ratio at most half of the official one


def class_names(count):
    """The per-trainer benchmark's stand-in class names."""
    return [f"class number {index}" for index in range(count)]


# --------------------------------------------------------------------------- command line

def add_arguments(parser):
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        help="methods of tools/official_methods/ (default: all with an official_trainer: "
                        f"{', '.join(m for m, spec in oe.METHODS.items() if 'official_trainer' in spec)})")
    parser.add_argument("--official-git", action="append", default=[], metavar="OWNER/NAME=PATH",
                        help="clone (or git directory) of an official repository, e.g. KaiyangZhou/CoOp=CoOp; "
                             "one per repository the methods need")
    parser.add_argument("--dassl-git", help="clone (or git directory) of Dassl.pytorch, for the repositories "
                        "without their own fork")
    parser.add_argument("--backbone", default="ViT-B/16", help="OpenAI CLIP name (or an open_clip config file)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)


def repositories(args, methods):
    """{owner/name: path} of ``--official-git``; exits naming what the methods miss."""
    given = {}
    for item in args.official_git:
        name, separator, path = item.partition("=")
        if not separator or not path:
            raise SystemExit(f"error: --official-git takes OWNER/NAME=PATH (e.g. KaiyangZhou/CoOp=CoOp), got '{item}'")
        given[name] = path
    needed = {oe.METHODS[method]["repository"] for method in methods}
    missing = sorted(needed - set(given))
    if missing:
        raise SystemExit(f"error: the methods {methods} need --official-git for {', '.join(missing)} "
                         "(OWNER/NAME=PATH each)")
    if not args.dassl_git and any("dassl_dir" not in oe.METHODS[method] for method in methods):
        raise SystemExit("error: --dassl-git is needed (a Dassl.pytorch clone) for "
                         + ", ".join(method for method in methods if "dassl_dir" not in oe.METHODS[method]))
    return given


def check_methods(methods):
    unknown = [method for method in methods if method not in oe.METHODS]
    if unknown:
        raise SystemExit(f"error: unknown method(s) {unknown}; tools/official_methods/ has {sorted(oe.METHODS)}")
    lacking = [method for method in methods if "official_trainer" not in oe.METHODS[method]]
    if lacking:
        raise SystemExit(f"error: the spec of {', '.join(lacking)} has no official_trainer (the official trainer "
                         "class to time); see tools/official_methods/__init__.py")


# --------------------------------------------------------------------------- measuring

def measure(args):
    """(settings, one record per method): both sides' medians, cost ratios and their quotient."""
    methods = list(args.methods or [method for method, spec in oe.METHODS.items() if "official_trainer" in spec])
    check_methods(methods)
    given = repositories(args, methods)
    settings = {key: getattr(args, key) for key in ("backbone", "batch", "classes", "rounds", "warmup", "threads",
                                                    "clock")}
    settings["methods"] = methods
    with tempfile.TemporaryDirectory(prefix="benchmark_official_") as workdir:
        settings["image_size"], _ = oe.write_weights(args.backbone, WEIGHTS_SEED, os.path.join(workdir, "weights.pt"))
        generator = torch.Generator().manual_seed(IMAGES_SEED)
        size = settings["image_size"]
        images = torch.randn((args.batch, 3, size, size), generator=generator)
        labels = torch.arange(args.batch) % args.classes
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save({"images": images, "labels": labels}, f)
        with atomic_write(os.path.join(workdir, "settings.json"), "w") as f:
            json.dump(dict(settings, classnames=class_names(args.classes)), f)
        exports, records = {}, []
        for method in methods:
            spec = oe.METHODS[method]
            if spec["repository"] not in exports:
                folder = os.path.join(workdir, "trees", spec["repository"].replace("/", "+"))
                exports[spec["repository"]] = oe.export_trees(spec, given[spec["repository"]], args.dassl_git, folder)
            official_commit, _, paths = exports[spec["repository"]]
            official_code = f"{spec['repository']}@{official_commit[:8]}"
            try:
                ours = run_side("ours", method, workdir, [ROOT], args.clock)
                official = run_side("official", method, workdir, paths + [ROOT], args.clock)
            except SideFailed as error:
                print(error, file=sys.stderr)
                records.append({"case": method, "official_code": official_code, "error": str(error).splitlines()[0]})
                continue
            records.append(method_record(method, official_code, ours, official, args.clock))
    return settings, records


class SideFailed(RuntimeError):
    """One side of a method could not be measured (its first line names it; the rest is its stderr)."""


def run_side(side, method, workdir, python_path, clock):
    """Measure one side in a fresh process; its result {"train"/"frozen": {clock: median s}, "learnable": n}.

    Raises:
        SideFailed: the process failed.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path))
    if clock == "cpu":
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    command = [sys.executable, os.path.abspath(__file__), "--side", side, workdir, method]
    done = subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise SideFailed(f"the {side} side of {method} failed (exit status {done.returncode}): {' '.join(command)} "
                         f"with PYTHONPATH={env['PYTHONPATH']}\n{done.stderr[-4000:]}")
    with open(os.path.join(workdir, f"{side}-{method}.json")) as f:
        return json.load(f)


def method_record(method, official_code, ours, official, clock):
    """The record of a method from the two sides' results: ms on both clocks, each side's cost
    ratio train / frozen by ``clock``, and ours / official of the cost ratios and of the train times."""
    record = {"case": method, "official_code": official_code, "clock": clock}
    for name, side in (("ours", ours), ("official", official)):
        for part in ("train", "frozen"):
            for which in ("wall", "cpu"):
                record[f"{name}_{part}_{which}_ms"] = 1000 * side[part][which]
            record[f"{name}_{part}_ms"] = record[f"{name}_{part}_{clock}_ms"]
        record[f"{name}_ratio"] = record[f"{name}_train_ms"] / record[f"{name}_frozen_ms"]
        record[f"{name}_learnable"] = side["learnable"]
    record["ours_over_official"] = record["ours_ratio"] / record["official_ratio"]
    record["ours_over_official_train_ms"] = record["ours_train_ms"] / record["official_train_ms"]
    record["over_contract"] = record["ours_over_official"] > CONTRACT_RATIO
    return record


def _side_inputs(workdir):
    with open(os.path.join(workdir, "settings.json")) as f:
        settings = json.load(f)
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    torch.set_num_threads(settings["threads"])
    return settings, inputs["images"], inputs["labels"]


def _timed(frozen, train, settings, learnable):
    """{"train"/"frozen": {clock: median s}, "learnable": n} of interleaved rounds."""
    from vlprompt.benchmarking.measure import medians, time_interleaved

    with contextlib.redirect_stdout(io.StringIO()):
        times = time_interleaved({"frozen": frozen, "train": train}, torch.device("cpu"), settings["rounds"],
                                 settings["warmup"])
    return dict(medians(times), learnable=learnable)


def our_side(workdir, method):
    """Our trainer's step and the frozen CLIP forward (run in the subprocess)."""
    from vlprompt.benchmarking.trainer_cases import CASES, build_trainer
    from vlprompt.project import import_project_package

    import_project_package("trainers")
    settings, images, labels = _side_inputs(workdir)
    spec = oe.METHODS[method]
    case = {case.name: case for case in CASES}[spec.get("benchmark_case", method)]
    nodes = spec.get("our_nodes", {f"TRAINER.{case.trainer.upper()}": spec["our_node"]})
    opts = [item for node, values in nodes.items() for key, value in values.items()
            for item in (f"{node}.{key}", repr(value))]
    if "dataset" in spec:
        opts += ["DATASET.NAME", spec["dataset"]]
    trainer_settings = {"backbone": settings["backbone"], "weights": os.path.join(workdir, "weights.pt"),
                        "image_size": images.shape[-1], "device": "cpu", "batch": len(images), "prec": "fp32",
                        "opts": opts, "classes": settings["classes"]}
    with tempfile.TemporaryDirectory(prefix="benchmark_official_ours_") as output_dir:
        trainer = build_trainer(case, trainer_settings, output_dir)
        trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)
        batch = {"img": images, "label": labels}

        def frozen():
            with torch.no_grad():
                trainer.model.clip.encode_image_plain(images)

        def train():
            trainer.set_model_mode("train")
            trainer.forward_backward(batch)

        learnable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        return _timed(frozen, train, settings, learnable)


# The design of an unprompted CLIP for the vendored clip packages whose build_model takes one
# (MaPLe-derived code, e.g. ATPrompt's): no vision or language prompts.
PLAIN_DESIGN = {"trainer": "CoOp", "vision_depth": 0, "language_depth": 0, "vision_ctx": 0, "language_ctx": 0}


def _plain_official_clip(official_clip, state_dict):
    """The official clip package's plain CLIP (fp32, eval) of ``state_dict``: the frozen unit."""
    parameters = inspect.signature(official_clip.build_model).parameters
    args = (state_dict, PLAIN_DESIGN) if "design_details" in parameters else (state_dict,)
    return official_clip.build_model(*args).float().eval()


def official_side(workdir, method):
    """The official trainer's step and the official frozen CLIP forward (run in the subprocess,
    the official tree first on ``PYTHONPATH``)."""
    settings, images, labels = _side_inputs(workdir)
    weights_path = os.path.join(workdir, "weights.pt")
    request = {"method": method, "backbone": settings["backbone"]}
    spec, cfg, module, official_clip = oe.official_setup(request, images.shape[-1], weights_path)
    from dassl.engine.trainer import TrainerBase

    for key, value in spec.get("official_train_cfg", {}).items():
        parent = cfg
        for part in key.split(".")[:-1]:
            parent = getattr(parent, part)
        setattr(parent, key.split(".")[-1], value)
    cfg.OPTIM.NAME = "sgd"
    torch.nn.Module.cuda = lambda self, device=None: self  # CPU only
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self
    trainer_class = getattr(module, spec["official_trainer"])
    trainer = trainer_class.__new__(trainer_class)
    TrainerBase.__init__(trainer)  # the model / optimizer registry, without TrainerX's data loader
    trainer.cfg, trainer.device = cfg, torch.device("cpu")
    trainer.dm = SimpleNamespace(dataset=SimpleNamespace(classnames=settings["classnames"]))
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.build_model()
        clip_model = _plain_official_clip(official_clip, torch.load(weights_path, weights_only=True))
    trainer.model.float()
    if "prepare_official_model" in spec:
        spec["prepare_official_model"](trainer.model)
    trainer.batch_idx, trainer.num_batches = 0, 1000  # not the epoch's last batch: no scheduler step
    batch = {"img": images, "label": labels}

    def frozen():
        with torch.no_grad():
            clip_model.encode_image(images)

    def train():
        trainer.set_model_mode("train")
        trainer.forward_backward(batch)

    learnable = sum(p.numel() for group in trainer.optim.param_groups for p in group["params"] if p.requires_grad)
    return _timed(frozen, train, settings, learnable)


# --------------------------------------------------------------------------- report

HEADERS = ["method", "official code", "learnable ours", "learnable official", "ours train ms", "ours frozen ms",
           "ours train / frozen", "official train ms", "official frozen ms", "official train / frozen",
           "ours / official", "train ms ours / official", "> 0.5"]


def table_rows(records):
    return [_row(record) for record in records]


def _row(r):
    if "error" in r:
        return [r["case"], r["official_code"], r["error"]] + [""] * (len(HEADERS) - 3)
    return [r["case"], r["official_code"], f"{r['ours_learnable']:,}", f"{r['official_learnable']:,}",
            f"{r['ours_train_ms']:.0f}", f"{r['ours_frozen_ms']:.0f}", f"{r['ours_ratio']:.2f}",
            f"{r['official_train_ms']:.0f}", f"{r['official_frozen_ms']:.0f}", f"{r['official_ratio']:.2f}",
            f"{r['ours_over_official']:.2f}", f"{r['ours_over_official_train_ms']:.2f}",
            "yes" if r["over_contract"] else ""]


def header_line(settings):
    return (f"One training step (forward, loss, backward, optimizer step), ours and the official code's: "
            f"{settings['backbone']} random weights, batch {settings['batch']}, {settings['classes']} classes, "
            f"{settings['image_size']} px, fp32, CPU, {settings['threads']} threads; median of {settings['rounds']} "
            f"rounds after {settings['warmup']}; {settings['clock']} clock")


def summary_lines(report):
    results = report["results"]
    over = [record["case"] for record in results if record.get("over_contract")]
    failed = [record["case"] for record in results if "error" in record]
    verdict = f"over {CONTRACT_RATIO}: {', '.join(over)}" if over else f"every method measured at most {CONTRACT_RATIO}"
    lines = ["ours / official = (ours train / frozen) / (official train / frozen), each side's frozen CLIP image "
             f"forward of the same batch in the same process; issue 18 wants at most {CONTRACT_RATIO}: {verdict}"]
    if failed:
        lines.append(f"not measured (the row gives the error): {', '.join(failed)}")
    return lines


def main(argv=None):
    """One side of one method (the subprocess ``run_side`` starts): writes WORKDIR/<side>-<method>.json."""
    parser = argparse.ArgumentParser(description="One side of tools/benchmark.py official (which runs this file "
                                     "in a subprocess per side and method); use that command.")
    parser.add_argument("--side", choices=("ours", "official"), required=True)
    parser.add_argument("workdir", help="the folder with settings.json, inputs.pt and weights.pt")
    parser.add_argument("method", choices=sorted(oe.METHODS))
    args = parser.parse_args(argv)
    result = {"ours": our_side, "official": official_side}[args.side](args.workdir, args.method)
    with atomic_write(os.path.join(args.workdir, f"{args.side}-{args.method}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
