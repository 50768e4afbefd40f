"""``tools/benchmark.py official``: one training step of our trainers and of their official code,
side by side on the same random CLIP and the same batch.

For every method of vlprompt_app/fidelity/methods/ with a ``CostSpec`` (or ``--methods``), two fresh
processes, each timing in interleaved rounds (median of ``--rounds`` after ``--warmup`` untimed ones) its training step
and its unit, a frozen CLIP image forward of the same batch without autograd:

* ours: the method's trainer (the benchmark case its trainer declares, built through
  its own class from its config file with the cost spec's ``our_nodes`` set over it, fp32): the unit is
  ``encode_image_plain``; the step is ``set_model_mode("train")`` and ``forward_backward`` of the
  batch (forward, loss, backward, optimizer step on the trainable parameters of its recipe), as
  the engine calls them per batch;
* official: the official trainer class (``CostSpec.trainer``) in a subprocess with the official
  tree and its Dassl fork first on ``PYTHONPATH``, set up as the equivalence sets it up
  (``official_env``: stand-ins, ``clip._download`` pointed at the weights file, the spec's Dassl
  config) plus ``CostSpec.train_cfg`` and SGD; the trainer is made without
  its ``__init__`` (which builds a data loader): Dassl's model registry, then its own
  ``build_model`` (CLIP load, trainable parameters, optimizer; ``.cuda()`` is a no-op, as
  ProGrad's moves its zero-shot CLIP there) and, per step, ``set_model_mode("train")`` and its
  own ``forward_backward``. The official model is cast to fp32 after build_model (the official
  fp32 branch; MaPLe's coupling F_1 stays fp16 otherwise) and gets the spec's
  ``prepare_official_model``. The unit is the official clip package's CLIP (its ``build_model`` of
  the weights file, fp32) ``encode_image``. A cost spec may add what the official recipe's step
  needs beyond ``forward_backward``: ``before_build(module, cfg)`` (files or loaders build_model
  reads), ``after_build(trainer)`` (what its ``before_train`` sets up) and ``step(trainer,
  batch)`` (the step itself, e.g. a cache pass before ``forward_backward``); ``our_prepare(workdir,
  image size)`` (files our trainer reads; returns more KEY VALUE options) and
  ``our_after_build(trainer)`` do the same for our trainer;
* official code without a Dassl trainer class (wise-ft's FT / LP, FLYP) and the test-time methods
  (TPT, PromptAlign) give instead ``CostSpec.step_side(request, weights_path, inputs)``, run in the
  same subprocess with the stand-ins installed: it builds the official model its own way and
  returns the official recipe's step (a zero-argument callable) and its optimizer; the learnable
  count is then the optimizer's parameters that the timed steps gave a gradient (upstream may hand
  its optimizer parameters that never get one, e.g. wise-ft's unused text embedding). The unit is
  again the official clip package's plain CLIP ``encode_image``.

A test-time method (its case's kind "test-time"; its cost spec gives ``views``, the views of one test
image in its recipe, which ``--views`` overrides) is timed per episode instead of per training
step: both sides get the same V seeded random images as one image's views; the "step" is one episode, its adaptation on the views
and the prediction of view 0 (ours: ``adapt_and_predict``, as ``test()`` calls it; official: the
official per-image loop body around its ``test_time_tuning``), and the unit is the frozen CLIP
image forward of those views. Our learnable count there is what an episode tunes
(``episode_learnable``). A cached case (its kind "cached", e.g. LP) trains from the batch's
image features, computed once before the rounds, as its feature cache gives them.

Both sides get the batch as their data loaders give it: ``--batch`` images, as a list of
K_TRANSFORMS views when the side's config has DATALOADER.K_TRANSFORMS > 1 (the same images for
every view), and the images again as "img0" with DATALOADER.RETURN_IMG0.

Both sides read one weights file (the equivalence's seeded random CLIP, ``weights.py``), one batch
of ``--batch`` seeded random images with labels 0, 1, ... modulo ``--classes`` (``--batch 0``: each
method's recipe batch, ``recipe_batch``: the first B of one set of seeded images), and the class
names "class number i" of the per-trainer benchmark.

Each side also reports its peak memory: before the timed rounds (and, on the official side,
before the official frozen unit's separate CLIP is built) one untimed step runs after the
peak was reset, and ``peak_memory_mib`` reads it (CUDA: ``torch.cuda.max_memory_allocated``,
so the weights, the optimizer's state and the step's activations; CPU: the process's peak
resident set). "peak ours / official" is their quotient, which the project wants at most 0.5
on a GPU at the papers' settings, as the step time. A side's cost ratio is its step over its
unit (same process, same rounds), so the two sides' ratios compare across processes and load;
"ours / official" is our cost ratio over the official one, which the project's cost contract
wants at most 0.5 (flagged otherwise); the table also gives the quotient of the two steps' times alone and the
learnable parameters each side's optimizer updates. Under ``--clock cpu`` both processes run with
OMP_WAIT_POLICY=PASSIVE (unless set), as the per-trainer family's do.

The subprocesses are ``python -m vlprompt_app.fidelity.side cost-ours|cost-official WORKDIR METHOD``.
"""
import contextlib
import inspect
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

from vlprompt.fileio import atomic_write

from .export import export_trees
from .harness import side_command, side_environment
from .methods import METHODS
from .official_env import install_stand_ins, official_setup
from .spec import DEFAULT_SEEDS
from .weights import write_weights

WEIGHTS_SEED = DEFAULT_SEEDS["weights"]
IMAGES_SEED = DEFAULT_SEEDS["images"]
CONTRACT_RATIO = 0.5  # the cost contract: our train cost ratio at most half of the official one
PRECISIONS = ("fp32", "recipe")


def timed_by_the_tool(spec):
    """Whether the tool can time the method's official side: an official Dassl trainer class or a step hook."""
    return spec.cost is not None and (spec.cost.trainer is not None or spec.cost.step_side is not None)


def class_names(count):
    """The per-trainer benchmark's stand-in class names."""
    return [f"class number {index}" for index in range(count)]


# --------------------------------------------------------------------------- command line

def add_arguments(parser):
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        help="methods of vlprompt_app/fidelity/methods/ (default: all with an official trainer "
                        "or step: "
                        f"{', '.join(m for m, spec in METHODS.items() if timed_by_the_tool(spec))})")
    parser.add_argument("--official-git", action="append", default=[], metavar="OWNER/NAME=PATH",
                        help="clone (or git directory) of an official repository, e.g. KaiyangZhou/CoOp=CoOp; "
                             "one per repository the methods need")
    parser.add_argument("--dassl-git", help="clone (or git directory) of Dassl.pytorch, for the repositories "
                        "without their own fork")
    parser.add_argument("--backbone", default="ViT-B/16", help="OpenAI CLIP name (or an open_clip config file)")
    parser.add_argument("--batch", type=int, default=4,
                        help="training batch of both sides (0: each method's recipe batch, the DATALOADER.TRAIN_X."
                             "BATCH_SIZE of its benchmark case's config file)")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--views", type=int, help="views of a test-time method's episode (default: its spec's "
                        "views, the recipe's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: both sides on the GPU, the official code on its own CUDA path (no .cuda() no-op)")
    parser.add_argument("--side-limit", type=float, metavar="SECONDS",
                        help="stop a side's process after this many seconds and report the method as failed "
                             "(default: no limit)")
    parser.add_argument("--prec", choices=PRECISIONS, default="fp32",
                        help="fp32: both sides in fp32 (the CPU comparison); recipe: each side in its recipe's "
                             "precision (ours: the config file's PREC; official: the cost spec's official_prec, "
                             "what its train.py or config sets)")


def repositories(args, methods):
    """{owner/name: path} of ``--official-git``; exits naming what the methods miss."""
    given = {}
    for item in args.official_git:
        name, separator, path = item.partition("=")
        if not separator or not path:
            raise SystemExit(f"error: --official-git takes OWNER/NAME=PATH (e.g. KaiyangZhou/CoOp=CoOp), got '{item}'")
        given[name] = path
    needed = {METHODS[method].repository for method in methods}
    missing = sorted(needed - set(given))
    if missing:
        raise SystemExit(f"error: the methods {methods} need --official-git for {', '.join(missing)} "
                         "(OWNER/NAME=PATH each)")
    dassl = [method for method in methods if METHODS[method].needs_dassl]
    if not args.dassl_git and dassl:
        raise SystemExit("error: --dassl-git is needed (a Dassl.pytorch clone) for " + ", ".join(dassl))
    return given


def check_methods(methods):
    unknown = [method for method in methods if method not in METHODS]
    if unknown:
        raise SystemExit(f"error: unknown method(s) {unknown}; vlprompt_app/fidelity/methods/ has {sorted(METHODS)}")
    lacking = [method for method in methods if not timed_by_the_tool(METHODS[method])]
    if lacking:
        raise SystemExit(f"error: the spec of {', '.join(lacking)} has no CostSpec trainer (the official trainer "
                         "class to time) nor step_side (the official step); see vlprompt_app/fidelity/spec.py")


# --------------------------------------------------------------------------- measuring

def measure(args, on_record=None):
    """(settings, one record per method): both sides' medians, cost ratios and their quotient;
    ``on_record(record)`` is called as soon as each method is measured."""
    methods = list(args.methods or [method for method, spec in METHODS.items() if timed_by_the_tool(spec)])
    check_methods(methods)
    given = repositories(args, methods)
    settings = {key: getattr(args, key) for key in ("backbone", "batch", "classes", "rounds", "warmup", "threads",
                                                    "clock", "device", "prec")}
    recipe_only = [method for method in methods if METHODS[method].cost.recipe_only]
    if args.prec == "fp32" and recipe_only:
        raise SystemExit(f"error: the official step of {', '.join(recipe_only)} runs only in its recipe's precision "
                         "(see its spec); use --prec recipe")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda, but CUDA is not available")
        on_cpu_only = [method for method in methods if METHODS[method].cost.step_side is not None]
        if on_cpu_only:
            raise SystemExit(f"error: {', '.join(on_cpu_only)} time a step_side, which runs on the CPU only")
        settings["device_name"] = torch.cuda.get_device_name()
    settings["methods"] = methods
    if args.views is not None and args.views < 1:
        raise SystemExit(f"error: --views must be at least 1, got {args.views}")
    settings["views"] = {method: args.views or METHODS[method].cost.views for method in methods
                         if METHODS[method].cost.views is not None}
    if args.batch < 0:
        raise SystemExit(f"error: --batch must be at least 1, or 0 for each method's recipe batch; got {args.batch}")
    settings["batches"] = {method: args.batch or recipe_batch(method) for method in methods}
    with tempfile.TemporaryDirectory(prefix="benchmark_official_") as workdir:
        settings["image_size"], _ = write_weights(args.backbone, WEIGHTS_SEED, os.path.join(workdir, "weights.pt"))
        generator = torch.Generator().manual_seed(IMAGES_SEED)
        size = settings["image_size"]
        batch = max(settings["batches"].values())  # a method takes the first of these images
        images = torch.randn((batch, 3, size, size), generator=generator)
        labels = torch.arange(batch) % args.classes
        inputs = {"images": images, "labels": labels}
        views = max(settings["views"].values(), default=0)
        if views:  # one test image's views, for the test-time methods (each takes its first ``views``)
            inputs["views"] = torch.randn((views, 3, size, size), generator=generator)
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save(inputs, f)
        with atomic_write(os.path.join(workdir, "settings.json"), "w") as f:
            json.dump(dict(settings, classnames=class_names(args.classes)), f)
        with atomic_write(os.path.join(workdir, "request.json"), "w") as f:  # read by a spec's prepare_official
            json.dump({"backbone": args.backbone, "classnames": class_names(args.classes)}, f)
        exports, records = {}, []
        for method in methods:
            spec = METHODS[method]
            if spec.repository not in exports:
                folder = os.path.join(workdir, "trees", spec.repository.replace("/", "+"))
                exports[spec.repository] = export_trees(spec, given[spec.repository], args.dassl_git, folder)
            official_commit, _, paths = exports[spec.repository]
            official_code = f"{spec.repository}@{official_commit[:8]}"
            try:
                ours = run_side("ours", method, workdir, [], args.clock, limit=args.side_limit)
                official = run_side("official", method, workdir, paths, args.clock, limit=args.side_limit)
            except SideFailed as error:
                print(error, file=sys.stderr)
                records.append({"case": method, "official_code": official_code, "error": str(error).splitlines()[0]})
            else:
                records.append(method_record(method, official_code, ours, official, args.clock))
            records[-1]["batch"] = settings["batches"][method]
            if on_record is not None:
                on_record(records[-1])
    return settings, records


class SideFailed(RuntimeError):
    """One side of a method could not be measured (its first line names it; the rest is its stderr)."""


def recipe_batch(method):
    """The training batch of ``method``'s recipe: its benchmark case's batch, else the
    DATALOADER.TRAIN_X.BATCH_SIZE of the case's config file (with its ``_BASE_`` files)."""
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file
    from vlprompt_app.benchmarking.trainer_cases import ROOT, case_named
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")  # their config nodes
    case = case_named(METHODS[method].cost.case or method)
    if case.batch:
        return case.batch
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs", "trainers", case.config))
    return cfg.DATALOADER.TRAIN_X.BATCH_SIZE


def run_side(side, method, workdir, official_paths, clock, limit=None):
    """Measure one side in a fresh process (``official_paths`` first on its PYTHONPATH, then this
    repository), stopped after ``limit`` seconds unless None; its result {"train"/"frozen": {clock:
    median s}, "learnable": n, "peak_memory_mib", "seconds" (the process's wall time)}.

    Raises:
        SideFailed: the process failed or ran past ``limit``.
    """
    env = side_environment(official_paths)
    if clock == "cpu":
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    command = side_command([f"cost-{side}", workdir, method])
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr or ""
        raise SideFailed(f"the {side} side of {method} did not finish within its limit of {limit:g} s (--side-limit): "
                         f"{' '.join(command)}\n{stderr[-4000:]}") from None
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SideFailed(f"the {side} side of {method} failed (exit status {done.returncode}): {' '.join(command)} "
                         f"with PYTHONPATH={env['PYTHONPATH']}\n{done.stderr[-4000:]}")
    print(f"{method}: the {side} side measured in {seconds:.0f} s", file=sys.stderr, flush=True)
    with open(os.path.join(workdir, f"{side}-{method}.json")) as f:
        return dict(json.load(f), seconds=seconds)


def method_record(method, official_code, ours, official, clock):
    """The record of a method from the two sides' results: ms on both clocks, each side's cost
    ratio train / frozen by ``clock``, ours / official of the cost ratios and of the train times, and
    (when both sides read it) each side's peak memory and their quotient."""
    record = {"case": method, "official_code": official_code, "clock": clock}
    for name, side in (("ours", ours), ("official", official)):
        for part in ("train", "frozen"):
            for which in ("wall", "cpu"):
                record[f"{name}_{part}_{which}_ms"] = 1000 * side[part][which]
            record[f"{name}_{part}_ms"] = record[f"{name}_{part}_{clock}_ms"]
        record[f"{name}_ratio"] = record[f"{name}_train_ms"] / record[f"{name}_frozen_ms"]
        record[f"{name}_learnable"] = side["learnable"]
        record[f"{name}_peak_mib"] = side.get("peak_memory_mib")
        record[f"{name}_side_s"] = side.get("seconds")
    record["ours_over_official"] = record["ours_ratio"] / record["official_ratio"]
    record["ours_over_official_train_ms"] = record["ours_train_ms"] / record["official_train_ms"]
    record["over_contract"] = record["ours_over_official"] > CONTRACT_RATIO
    peaks = record["ours_peak_mib"], record["official_peak_mib"]
    record["ours_over_official_peak"] = peaks[0] / peaks[1] if None not in peaks else None
    return record


def _side_inputs(workdir, method):
    """(settings, images [B, 3, R, R], labels [B]) of a method: the batch, or for a test-time method
    (its views in the settings) the first V views of one test image, labelled 0."""
    with open(os.path.join(workdir, "settings.json")) as f:
        settings = json.load(f)
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    torch.set_num_threads(settings["threads"])
    device = torch.device(settings["device"])
    views = settings.get("views", {}).get(method)
    if views:
        return settings, inputs["views"][:views].to(device), torch.zeros(views, dtype=torch.long, device=device)
    batch = settings.get("batches", {}).get(method)  # None: all the images
    return settings, inputs["images"][:batch].to(device), inputs["labels"][:batch].to(device)


def _step_peak(train, settings):
    """The peak memory (MiB, ``peak_memory_mib``) of one untimed call of ``train`` after the peak was reset."""
    from vlprompt_app.benchmarking.measure import peak_memory_mib, reset_peak_memory

    device = torch.device(settings["device"])
    reset_peak_memory(device)
    with contextlib.redirect_stdout(io.StringIO()):
        train()
    return peak_memory_mib(device)


def _timed(frozen, train, settings, learnable, peak):
    """{"train"/"frozen": {clock: median s}, "learnable": n, "peak_memory_mib": ``peak``} of
    interleaved rounds; ``learnable`` is the count, or a function giving it after the rounds."""
    from vlprompt_app.benchmarking.measure import medians, time_interleaved

    with contextlib.redirect_stdout(io.StringIO()):
        times = time_interleaved({"frozen": frozen, "train": train}, torch.device(settings["device"]),
                                 settings["rounds"], settings["warmup"])
    return dict(medians(times), learnable=learnable() if callable(learnable) else learnable, peak_memory_mib=peak)


def loader_batch(images, labels, dataloader_cfg):
    """The training batch as a Dassl loader gives it under ``dataloader_cfg`` (cfg.DATALOADER):
    {"img": images [B, 3, R, R], or a list of K_TRANSFORMS such views when K_TRANSFORMS > 1,
    "label": [B], and "img0": the images when RETURN_IMG0}."""
    views = dataloader_cfg.K_TRANSFORMS
    batch = {"img": images if views == 1 else [images] * views, "label": labels}
    if dataloader_cfg.RETURN_IMG0:
        batch["img0"] = images
    return batch


def _set_official_train_cfg(cfg, values):
    """Set {dotted key: value} on the official Dassl config; a dict value becomes a new node."""
    from yacs.config import CfgNode as CN

    for key, value in values.items():
        parent = cfg
        for part in key.split(".")[:-1]:
            parent = getattr(parent, part)
        setattr(parent, key.split(".")[-1], CN(value) if isinstance(value, dict) else value)


def our_side(workdir, method):
    """Our trainer's step and the frozen CLIP forward (run in the subprocess)."""
    from vlprompt.engine.benchmark_case import CACHED, TEST_TIME
    from vlprompt_app.benchmarking.trainer_cases import build_trainer, case_named
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")
    settings, images, labels = _side_inputs(workdir, method)
    spec = METHODS[method]
    cost = spec.cost
    case = case_named(cost.case or method)
    nodes = cost.our_nodes if cost.our_nodes is not None else {f"TRAINER.{case.trainer.upper()}": spec.our_node}
    keep_config_prec = settings["prec"] == "recipe"
    opts = [item for node, values in nodes.items() for key, value in values.items()
            if not (keep_config_prec and key == "PREC") for item in (f"{node}.{key}", repr(value))]
    if spec.dataset:
        opts += ["DATASET.NAME", spec.dataset]
    if cost.our_prepare is not None:
        opts += cost.our_prepare(workdir, images.shape[-1])
    trainer_settings = {"backbone": settings["backbone"], "weights": os.path.join(workdir, "weights.pt"),
                        "image_size": images.shape[-1], "device": settings["device"], "batch": len(images),
                        "prec": "fp32" if settings["prec"] == "fp32" else None,
                        "opts": opts, "classes": settings["classes"]}
    with tempfile.TemporaryDirectory(prefix="benchmark_official_ours_") as output_dir:
        trainer = build_trainer(case, trainer_settings, output_dir)
        if cost.our_after_build is not None:
            cost.our_after_build(trainer)
        trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)

        def frozen():
            with torch.no_grad(), trainer.autocast():
                trainer.model.clip.encode_image_plain(images)

        if case.kind == TEST_TIME:  # one episode on the views, as test() runs it per image
            trainer.start_episodes()

            def train():
                with trainer.model.evaluation(), torch.no_grad():
                    trainer.adapt_and_predict(images)

            return _timed(frozen, train, settings, trainer.episode_learnable(), _step_peak(train, settings))
        if case.kind == CACHED:  # the features the feature cache gives, computed once
            with torch.no_grad():
                batch = {"features": trainer.model.encode_image_features(images), "label": labels}
        else:
            batch = loader_batch(images, labels, trainer.cfg.DATALOADER)
            if case.batch_keys is not None:
                batch.update(case.batch_keys(trainer, len(images)))

        def train():
            trainer.set_model_mode("train")
            trainer.forward_backward(batch)

        learnable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        return _timed(frozen, train, settings, learnable, _step_peak(train, settings))


# The design of an unprompted CLIP for the vendored clip packages whose build_model takes one
# (MaPLe-derived code, e.g. ATPrompt's): no vision or language prompts. IVLP-derived packages
# (PromptSRC's family) accept only their own trainer names: their specs give ``plain_design``.
PLAIN_DESIGN = {"trainer": "CoOp", "vision_depth": 0, "language_depth": 0, "vision_ctx": 0, "language_ctx": 0}


def _plain_official_clip(official_clip, state_dict, spec, fp32=True):
    """The official clip package's plain CLIP (eval) of ``state_dict``: the frozen unit (for a clip
    package whose build_model takes a design: the cost spec's ``plain_design``, default
    PLAIN_DESIGN). In fp32, or else as its build_model gives it (OpenAI's fp16 conversion, which
    keeps LayerNorm in fp32)."""
    parameters = inspect.signature(official_clip.build_model).parameters
    design = spec.cost.plain_design or PLAIN_DESIGN
    args = (state_dict, design) if "design_details" in parameters else (state_dict,)
    model = official_clip.build_model(*args)
    return (model.float() if fp32 else model).eval()


def official_side(workdir, method):
    """The official step (its trainer's, or the cost spec's ``step_side``) and the official
    frozen CLIP forward (run in the subprocess, the official tree first on ``PYTHONPATH``)."""
    settings, images, labels = _side_inputs(workdir, method)
    weights_path = os.path.join(workdir, "weights.pt")
    spec = METHODS[method]
    cost = spec.cost
    if cost.step_side is not None:
        return _official_step_side(spec, settings, weights_path, images, labels, method)
    cfg, module, official_clip = official_setup(spec, settings["backbone"], images.shape[-1], weights_path)
    from dassl.engine.trainer import TrainerBase

    _set_official_train_cfg(cfg, cost.train_cfg)
    cfg.OPTIM.NAME = "sgd"
    recipe = settings["prec"] == "recipe"
    if recipe:
        _set_official_precision(cfg, spec, cost.official_prec)
    if settings["device"] == "cpu":
        torch.nn.Module.cuda = lambda self, device=None: self
        torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self
    trainer_class = getattr(module, cost.trainer)
    trainer = trainer_class.__new__(trainer_class)
    TrainerBase.__init__(trainer)  # the model / optimizer registry, without TrainerX's data loader
    trainer.cfg, trainer.device = cfg, torch.device(settings["device"])
    trainer.dm = SimpleNamespace(dataset=SimpleNamespace(classnames=settings["classnames"]))
    if cost.before_build is not None:
        cost.before_build(module, cfg)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.build_model()
    if not recipe:
        trainer.model.float()
    if spec.prepare_official_model is not None and not recipe:
        spec.prepare_official_model(trainer.model)
    if cost.after_build is not None:
        with contextlib.redirect_stdout(io.StringIO()):
            cost.after_build(trainer)
    trainer.batch_idx, trainer.num_batches = 0, 1000  # not the epoch's last batch: no scheduler step
    batch = loader_batch(images, labels, cfg.DATALOADER)
    step = cost.step or (lambda trainer, batch: trainer.forward_backward(batch))

    def train():
        trainer.set_model_mode("train")
        step(trainer, batch)

    peak = _step_peak(train, settings)  # before the unit's CLIP is built
    half = recipe and cost.official_prec == "fp16"  # the official CLIP's own dtypes on CUDA
    with contextlib.redirect_stdout(io.StringIO()):
        clip_model = _plain_official_clip(official_clip, torch.load(weights_path, weights_only=True), spec,
                                          fp32=not half)
    clip_model.to(trainer.device)

    def frozen():
        with torch.no_grad():
            clip_model.encode_image(images.to(clip_model.dtype))

    learnable = sum(p.numel() for group in trainer.optim.param_groups for p in group["params"] if p.requires_grad)
    return _timed(frozen, train, settings, learnable, peak)


def _set_official_precision(cfg, spec, precision):
    """Set ``precision`` as the PREC of every official config node of ``spec`` that has one."""
    for path in spec.official_cfg:
        node = cfg
        for part in path.split("."):
            node = getattr(node, part)
        if "PREC" in node:
            node.PREC = precision


def _official_step_side(spec, settings, weights_path, images, labels, method):
    """The step of the cost spec's ``step_side`` and the official clip package's frozen forward."""
    install_stand_ins()
    request = {"method": method, "backbone": settings["backbone"], "classnames": settings["classnames"]}
    with contextlib.redirect_stdout(io.StringIO()):
        train, optimizer = spec.cost.step_side(request, weights_path, {"images": images, "labels": labels})
    peak = _step_peak(train, settings)  # before the unit's CLIP is built
    from clip import clip as official_clip

    clip_model = _plain_official_clip(official_clip, torch.load(weights_path, weights_only=True), spec)

    def frozen():
        with torch.no_grad():
            clip_model.encode_image(images)

    def learnable():  # the optimizer's parameters the timed steps gave a gradient (those it updates)
        return sum(p.numel() for group in optimizer.param_groups for p in group["params"] if p.grad is not None)

    return _timed(frozen, train, settings, learnable, peak)


# --------------------------------------------------------------------------- report

HEADERS = ["method", "official code", "B", "learnable ours", "learnable official", "ours train ms", "ours frozen ms",
           "ours train / frozen", "official train ms", "official frozen ms", "official train / frozen",
           "ours / official", "train ms ours / official", "> 0.5", "peak MiB ours", "peak MiB official",
           "peak ours / official"]


def table_rows(records):
    return [_row(record) for record in records]


def _row(r):
    batch = r.get("batch", "")
    if "error" in r:
        return [r["case"], r["official_code"], batch, r["error"]] + [""] * (len(HEADERS) - 4)

    def number(key, form):
        return "" if r.get(key) is None else format(r[key], form)

    return [r["case"], r["official_code"], batch, f"{r['ours_learnable']:,}", f"{r['official_learnable']:,}",
            f"{r['ours_train_ms']:.0f}", f"{r['ours_frozen_ms']:.0f}", f"{r['ours_ratio']:.2f}",
            f"{r['official_train_ms']:.0f}", f"{r['official_frozen_ms']:.0f}", f"{r['official_ratio']:.2f}",
            f"{r['ours_over_official']:.2f}", f"{r['ours_over_official_train_ms']:.2f}",
            "yes" if r["over_contract"] else "", number("ours_peak_mib", ".0f"), number("official_peak_mib", ".0f"),
            number("ours_over_official_peak", ".2f")]


def header_line(settings):
    episodes = settings.get("views")
    episode = (" (for a test-time method one test image's episode: adaptation on its views, prediction of view "
               f"0; frozen = the views' forward; views {', '.join(f'{m} {v}' for m, v in episodes.items())})"
               if episodes else "")
    return (f"One training step (forward, loss, backward, optimizer step), ours and the official code's{episode}: "
            f"{settings['backbone']} random weights, {_batch_words(settings)}, {settings['classes']} classes, "
            f"{settings['image_size']} px, {_precision_words(settings)}, {_device_words(settings)}; median of {settings['rounds']} "
            f"rounds after {settings['warmup']}; {settings['clock']} clock")


def _batch_words(settings):
    if settings["batch"]:
        return f"batch {settings['batch']}"
    return "each method's recipe batch (column B)"


def _precision_words(settings):
    if settings.get("prec", "fp32") == "fp32":
        return "fp32"
    return "each side in its recipe's precision (ours: the config file's PREC; official: its train.py's or config's)"


def _device_words(settings):
    if settings.get("device", "cpu") == "cuda":
        return "CUDA (" + settings.get("device_name", "GPU") + ")"
    return f"CPU, {settings['threads']} threads"


def summary_lines(report):
    results = report["results"]
    over = [record["case"] for record in results if record.get("over_contract")]
    failed = [record["case"] for record in results if "error" in record]
    verdict = f"over {CONTRACT_RATIO}: {', '.join(over)}" if over else f"every method measured at most {CONTRACT_RATIO}"
    lines = ["ours / official = (ours train / frozen) / (official train / frozen), each side's frozen CLIP image "
             f"forward of the same batch in the same process; the contract wants at most {CONTRACT_RATIO}: {verdict}",
             "peak MiB: one untimed step's peak (CUDA max allocated: weights, optimizer state, activations; CPU: the "
             "side process's peak RSS)"]
    if failed:
        lines.append(f"not measured (the row gives the error): {', '.join(failed)}")
    return lines



def write_side(side, workdir, method):
    """In the subprocess: measure ``side`` ("ours" or "official") of ``method``, write WORKDIR/<side>-<method>.json."""
    result = {"ours": our_side, "official": official_side}[side](workdir, method)
    with atomic_write(os.path.join(workdir, f"{side}-{method}.json"), "w") as f:
        json.dump(result, f)
