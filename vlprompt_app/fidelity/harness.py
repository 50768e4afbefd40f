"""Compare a trainer's model with its official implementation on the same random weights.

Both sides get the same inputs, all generated from seeds in this process:

* a random CLIP (``--backbone``, OpenAI layout) saved as a plain OpenAI-format state-dict file
  (values rounded to fp16 so that the official ``clip.build_model``, which casts to fp16
  before the method's ``.float()``, holds exactly the same numbers);
* the learnable values (the context ctx [n, D]) drawn with ``LEARNABLE_SCALE`` times the
  official init std, so that a token in the wrong place moves the logits;
* a batch of images [B, 3, R, R] and labels [B], and a fixed list of class names.

Ours is built with ``load_clip`` (the file as ``MODEL.BACKBONE.WEIGHTS``) and the method's
``build_ours``; the official code runs in a subprocess of this file (``--official-side``) with
``PYTHONPATH`` set to trees exported (``git archive HEAD``) from the official repository and
its Dassl fork into a temporary folder. In that subprocess ``clip._download`` returns the
weights file (a method's ``prepare_official`` does the same for the method's own clip copy),
and what Dassl imports only for logging and for datasets it does not use here
(``torch.utils.tensorboard``, ``gdown``, ``wilds``, ``pandas``), and ``pkg_resources``
(holding only ``packaging``), are stand-ins, so nothing is installed. The official model
classes are built directly from a Dassl config (no data loader; the images are fed as
tensors), in fp32 (the official ``PREC`` fp32 branch), and their learnable parameters must
be exactly the ones the method's spec maps.

What each method compares, and how its two sides are built, is in its module under
``tools/official_methods/`` (the spec's contract is in that package's docstring). Each output
is compared by the relative max difference max|ours - official| / max|official|. The result
goes to ``tests/fixtures/official/<method>.json`` (seeds, class names, labels, settings,
parameter-name mapping, official outputs, official repository and commits), which
``tests/test_official_equivalence*.py`` rebuild our side against.

Usage (clones, or bare git directories, of the official repositories; HEAD is compared):

    python tools/official_equivalence.py CoOp --official-git CoOp --dassl-git Dassl.pytorch
    python tools/official_equivalence.py ProGrad --official-git Prompt-align
    python tools/official_equivalence.py MaPLe --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py DePT-MaPLe --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py DePT-CoOp --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py TCP --official-git Textual-based_Class-aware_prompt_tuning \
        --dassl-git Dassl.pytorch
    python tools/official_equivalence.py MMA --official-git Multi-Modal-Adapter --dassl-git Dassl.pytorch
    python tools/official_equivalence.py ProVP --official-git ProVP
    python tools/official_equivalence.py MMRL --official-git MMRL --dassl-git Dassl.pytorch
    python tools/official_equivalence.py MMRLpp --official-git MMRL --dassl-git Dassl.pytorch
    python tools/official_equivalence.py PromptKD --official-git PromptKD
    python tools/official_equivalence.py ATPrompt --official-git ATPrompt
    python tools/official_equivalence.py ATPrompt-MaPLe --official-git ATPrompt
    python tools/official_equivalence.py SkipTuning --official-git SkipTuning --dassl-git Dassl.pytorch
    python tools/official_equivalence.py FLYP --official-git FLYP
    python tools/official_equivalence.py TPT --official-git TPT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py TPT-CoCoOp --official-git TPT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py PromptAlign --official-git PromptAlign --dassl-git Dassl.pytorch
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import types

import torch

from vlprompt.fileio import atomic_write

import official_methods  # tools/official_methods/, next to this file: one module per method

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_DIR = os.path.join(ROOT, "tests", "fixtures", "official")
# Learnable values are drawn with this many times the official init std.
LEARNABLE_SCALE = 10.0
# Contract tolerance: relative max difference of logits and loss.
TOLERANCE = 3e-3
DEFAULT_SEEDS = {"weights": 1, "learnable": 2, "images": 3}
DEFAULT_CLASSNAMES = ["golden retriever", "sunflower", "fire truck"]
DEFAULT_BATCH = 2

METHODS = official_methods.METHODS


def relative_max_difference(ours, official):
    """max|ours - official| / max|official| of two tensors of the same shape (0 for equal ones)."""
    ours, official = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(official, dtype=torch.float64)
    if ours.shape != official.shape:
        raise ValueError(f"Shapes differ: ours {tuple(ours.shape)}, official {tuple(official.shape)}.")
    return ((ours - official).abs().max() / official.abs().max().clamp_min(1e-12)).item()


def _normal(generator, shape, std):
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def random_clip_state_dict(backbone, seed):
    """An OpenAI-layout CLIP state dict of ``backbone`` with seeded random values.

    Keys and shapes are those of open_clip's model for the backbone (the OpenAI layout);
    values are drawn in sorted key order from one generator: LayerNorm weights 1 + N(0, 0.1²),
    biases N(0, 0.02²), projections N(0, 1/fan_in), other tensors N(0, 0.02²), logit_scale
    log(100); every value is rounded to fp16.
    """
    from vlprompt.clip import load_clip

    model, _ = load_clip(backbone, "random")
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, tensor in sorted(model.state_dict().items()):
        shape = tuple(tensor.shape)
        if key == "logit_scale":
            value = torch.full(shape, math.log(100.0))
        elif ("ln_" in key or "ln_final" in key) and key.endswith(".weight"):
            value = 1.0 + _normal(generator, shape, 0.1)
        elif key.endswith("bias"):
            value = _normal(generator, shape, 0.02)
        elif key in ("text_projection", "visual.proj"):
            value = _normal(generator, shape, shape[0] ** -0.5)
        else:
            value = _normal(generator, shape, 0.02)
        state[key] = value.half().float()
    return state


def make_inputs(method, backbone_resolution, width, seeds, batch, n_classes):
    """Seeded learnable values {our name: tensor}, images [B, 3, R, R] and labels [B]."""
    spec = METHODS[method]
    generator = torch.Generator().manual_seed(seeds["learnable"])
    learnables = {}
    dims = {"n_ctx": spec["our_node"].get("N_CTX"), "width": width, "vision_width": 768, "embed": 512,
            "classes": n_classes}
    for name, entry in spec["learnables"].items():
        shape = tuple(dim if isinstance(dim, int) else dims[dim] for dim in entry.get("shape", ("n_ctx", "width")))
        value = entry.get("init_mean", 0.0) + _normal(generator, shape, LEARNABLE_SCALE * entry["init_std"])
        learnables[name] = value.half().float() if entry.get("fp16") else value
    generator = torch.Generator().manual_seed(seeds["images"])
    images = torch.randn((batch, 3, backbone_resolution, backbone_resolution), generator=generator)
    labels = torch.tensor(spec["labels"]) if "labels" in spec else torch.arange(batch) % n_classes
    return learnables, images, labels


def write_weights(backbone, seed, path):
    """Save the seeded random CLIP as a state-dict file; return (input resolution, text width)."""
    state = random_clip_state_dict(backbone, seed)
    with atomic_write(path) as f:
        torch.save(state, f)
    patch = state["visual.conv1.weight"].shape[-1]
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    return patch * grid, state["ln_final.weight"].shape[0]


def fixture_inputs(fixture, workdir):
    """Regenerate a fixture's inputs from its seeds: (weights file in ``workdir``, learnable values
    {our name: tensor}, images [B, 3, R, R], labels [B])."""
    weights_path = os.path.join(workdir, "weights.pt")
    resolution, width = write_weights(fixture["backbone"], fixture["seeds"]["weights"], weights_path)
    learnables, images, labels = make_inputs(fixture["method"], resolution, width, fixture["seeds"],
                                             fixture["batch"], len(fixture["classnames"]))
    return weights_path, learnables, images, labels


_LOADED_CLIP = {}


def _fresh_clip(backbone, weights_path):
    """A fresh copy of ``load_clip(backbone, weights_path)``'s model: the file is read once per
    process and copied for every model built on it (the side-by-side tests build dozens on one
    ViT-B/16 file; a copy costs a fraction of a load)."""
    from vlprompt.clip import load_clip

    key = (backbone, os.path.abspath(weights_path), os.path.getmtime(weights_path))
    if key not in _LOADED_CLIP:
        _LOADED_CLIP.clear()
        _LOADED_CLIP[key] = load_clip(backbone, weights_path)[0]
    return copy.deepcopy(_LOADED_CLIP[key])


def our_outputs(method, backbone, weights_path, classnames, learnables, images, labels, node_changes=None):
    """Our model's outputs {name: tensor} (at least those in ``METHODS[method]["outputs"]``), built
    by the method's ``build_ours`` on ``weights_path`` with the given learnable values and run by
    its ``run_ours``. ``node_changes`` overrides keys of our config node (the tests misplace a
    component with it)."""
    from yacs.config import CfgNode as CN

    from vlprompt.clip import CLIPRunner, Tokenizer
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")  # our trainers/ (the official side has its own of that name)
    spec = METHODS[method]
    model_clip = _fresh_clip(backbone, weights_path)
    node = CN(dict(spec["our_node"], **(node_changes or {})))
    model = spec["build_ours"](CLIPRunner(model_clip), Tokenizer(backbone), classnames, node, spec).eval()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in learnables.items():
            parameters[name].copy_(value)
    return spec["run_ours"](model, node, images, labels)


def _install_stand_ins():
    """Empty modules for what Dassl imports only for logging and for datasets not used here, and
    ``pkg_resources`` (setuptools) holding only ``packaging``, the one name some clip copies import from it."""
    import packaging.version
    import torchvision.ops  # noqa: F401  (imported before the stand-ins: torch._dynamo looks modules up)

    for name, attributes in (("torch.utils.tensorboard", {"SummaryWriter": None}), ("gdown", {}),
                             ("wilds", {"get_dataset": None}), ("pandas", {}),
                             ("pkg_resources", {"packaging": packaging})):
        stand_in = types.ModuleType(name)
        stand_in.__dict__.update(attributes)
        sys.modules[name] = stand_in


def official_setup(request, resolution, weights_path):
    """In a subprocess with the official trees on ``PYTHONPATH``: the stand-ins installed, the
    official ``clip._download`` pointed at ``weights_path``, the Dassl config of ``request``'s
    method (its spec's ``official_cfg``, ``request["backbone"]``, input size ``resolution``, the
    spec's dataset name, then its ``prepare_official``) and the official module imported.

    Returns:
        (spec, cfg, module, official clip module).
    """
    _install_stand_ins()
    import importlib

    from clip import clip as official_clip
    from dassl.config import get_cfg_default
    from yacs.config import CfgNode as CN

    spec = METHODS[request["method"]]
    official_clip._download = lambda url, root=None: weights_path
    cfg = get_cfg_default()
    for path, values in spec["official_cfg"].items():
        parent = cfg
        for part in path.split(".")[:-1]:
            parent = getattr(parent, part)
        setattr(parent, path.split(".")[-1], CN(values))
    cfg.MODEL.BACKBONE.NAME = request["backbone"]
    cfg.INPUT.SIZE = (resolution, resolution)
    cfg.DATASET.NAME = spec.get("dataset", "")
    if "prepare_official" in spec:
        spec["prepare_official"](cfg, weights_path)
    return spec, cfg, importlib.import_module(spec["official_module"]), official_clip


def _official_side(workdir):
    """Run in the subprocess: build the official model from ``workdir``'s request, write its outputs."""
    with open(os.path.join(workdir, "request.json")) as f:
        request = json.load(f)
    weights_path = os.path.join(workdir, "weights.pt")
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    images, labels = inputs["images"], inputs["labels"]
    spec = METHODS[request["method"]]
    if "official_side" in spec:  # official code without Dassl: the method builds and runs it itself
        _install_stand_ins()
        outputs = spec["official_side"](request, weights_path, inputs)
        with atomic_write(os.path.join(workdir, "official.pt")) as f:
            torch.save(outputs, f)
        return
    spec, cfg, module, _ = official_setup(request, images.shape[-1], weights_path)
    clip_model = module.load_clip_to_cpu(cfg).float()  # the official PREC fp32 branch
    if "build_official" in spec:
        model = spec["build_official"](module, cfg, request["classnames"], clip_model)
    else:
        # .float(): MaPLe's prompt learner casts its coupling F_1 to fp16 after the model's cast
        model = module.CustomCLIP(cfg, request["classnames"], clip_model).float().eval()
    parameters = dict(model.named_parameters())
    prefixes = spec.get("official_learnable_prefixes", ("prompt_learner.", "adapter_learner."))
    is_learnable = spec.get("official_learnable", lambda name: name.startswith(prefixes))
    learned = {name for name in parameters if is_learnable(name)} - set(spec.get("official_unused", ()))
    mapped = {entry["official"] for entry in spec["learnables"].values()}
    if learned != mapped:
        raise SystemExit(f"The official learnable parameters and the {request['method']} spec differ: official only "
                         f"{sorted(learned - mapped)}, mapped only {sorted(mapped - learned)}.")
    with torch.no_grad():
        for ours, entry in spec["learnables"].items():
            target = parameters[entry["official"]]
            target.copy_(inputs["learnables"][ours].view_as(target))  # e.g. a Linear's weight into a 1x1 conv's
    outputs = spec["run_official"](module, cfg, request, model, images, labels)
    with atomic_write(os.path.join(workdir, "official.pt")) as f:
        torch.save(outputs, f)


def _rounded(tensor):
    """A tensor as nested lists of floats with 7 significant digits (float32's precision)."""
    values = tensor.detach().double().flatten().tolist()
    rounded = torch.tensor([float(f"{value:.7g}") for value in values], dtype=torch.float64)
    return rounded.view(tensor.shape).tolist()


def _export(git_dir, target, exclude=()):
    """``git archive HEAD`` of ``git_dir`` into ``target`` without the paths in ``exclude``; return the commit."""
    found = subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"'{git_dir}' is not a git repository with a commit ({found.stderr.strip()}); "
                         "give a clone (or the git directory) of the official repository.")
    commit = found.stdout.strip()
    os.makedirs(target)
    pathspecs = ["--", "."] + [f":(exclude){path}" for path in exclude] if exclude else []
    archive = subprocess.run(["git", "-C", git_dir, "archive", "HEAD", *pathspecs], capture_output=True)
    if archive.returncode == 0:
        subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    else:
        _export_present_files(git_dir, target)
    return commit


def _export_present_files(git_dir, target):
    """Write HEAD's files one by one into ``target``, leaving out (and naming) those whose content
    the repository lacks, e.g. the large files of a snapshot that ``git archive`` refuses."""
    listing = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "-z", "HEAD"], check=True, capture_output=True)
    missing = []
    for entry in listing.stdout.decode().split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        kind, blob = meta.split()[1:]
        content = subprocess.run(["git", "-C", git_dir, "cat-file", "blob", blob], capture_output=True) \
            if kind == "blob" else None
        if content is None or content.returncode != 0:
            missing.append(path)
            continue
        with atomic_write(os.path.join(target, path), "wb") as f:
            f.write(content.stdout)
    print(f"git archive failed on {git_dir}; exported HEAD file by file, leaving out the files it lacks "
          f"({len(missing)}): {', '.join(missing)}")


def needs_dassl(spec):
    """Whether the method's official side needs a Dassl clone (--dassl-git): not when the repository
    holds its own fork (``dassl_dir``) or the method runs its official code without Dassl (``official_side``,
    or ``dassl`` False)."""
    return "dassl_dir" not in spec and "official_side" not in spec and spec.get("dassl", True)


def export_trees(spec, official_git, dassl_git, folder):
    """Export (``git archive HEAD``) the official repository of ``spec`` and, unless it holds its
    own fork (``dassl_dir``), the Dassl clone into ``folder`` (``official``, ``dassl``).

    Returns:
        (official commit, Dassl commit, [the official code folder, the Dassl folder]): the
        folders go first on the official side's ``PYTHONPATH``.
    """
    for label, path in (("--official-git", official_git), ("--dassl-git", dassl_git)):
        if path is not None and not os.path.isdir(path):
            raise SystemExit(f"{label} '{path}' is not a folder; "
                             "give a clone (or the git directory) of the repository.")
    official_commit = _export(official_git, os.path.join(folder, "official"), spec.get("archive_exclude", ()))
    code_path = os.path.join(folder, "official", spec["code_dir"])
    if not needs_dassl(spec):
        return official_commit, None, [code_path]
    if "dassl_dir" in spec:
        return official_commit, official_commit, [code_path, os.path.join(folder, "official", spec["dassl_dir"])]
    dassl_path = os.path.join(folder, "dassl")
    return official_commit, _export(dassl_git, dassl_path), [code_path, dassl_path]


def compare(method, official_git, dassl_git, backbone, seeds, classnames, batch):
    """Run both sides; return the fixture dict (with the measured differences)."""
    spec = METHODS[method]
    if "outputs" not in spec:
        raise SystemExit(f"{method}'s spec only times its official step (tools/benchmark.py official); its "
                         f"official comparison is {spec['compared_by']}.")
    with tempfile.TemporaryDirectory(prefix="official_equivalence_") as workdir:
        official_commit, dassl_commit, paths = export_trees(spec, official_git, dassl_git, workdir)
        request = {"method": method, "backbone": backbone, "classnames": classnames, "seeds": seeds, "batch": batch}
        weights_path, learnables, images, labels = fixture_inputs(request, workdir)
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save({"learnables": learnables, "images": images, "labels": labels}, f)
        with atomic_write(os.path.join(workdir, "request.json"), "w") as f:
            json.dump(request, f)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        command = [sys.executable, os.path.abspath(__file__), method, "--official-side", workdir]
        if subprocess.run(command, env=env, cwd=workdir).returncode != 0:
            raise SystemExit(f"The official side failed (its traceback is above): {' '.join(command)} "
                             f"with PYTHONPATH={env['PYTHONPATH']}.")
        official = torch.load(os.path.join(workdir, "official.pt"), weights_only=True)
        ours = our_outputs(method, backbone, weights_path, classnames, learnables, images, labels)
    return {
        "method": method,
        "official_repository": spec["repository"],
        "official_commit": official_commit,
        "dassl_commit": dassl_commit,
        "backbone": backbone,
        "seeds": seeds,
        "batch": batch,
        "classnames": classnames,
        "labels": labels.tolist(),
        "learnable_scale": LEARNABLE_SCALE,
        "official_cfg": spec["official_cfg"],
        "our_node": spec["our_node"],
        "parameter_mapping": {name: entry["official"] for name, entry in spec["learnables"].items()},
        "official_outputs": {key: _rounded(official[key]) for key in spec["outputs"]},
        "relative_max_difference": {key: relative_max_difference(ours[key], official[key]) for key in spec["outputs"]},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("method", help=f"one of {sorted(METHODS)}")
    parser.add_argument("--official-git", help="clone (or git directory) of the official repository")
    parser.add_argument("--dassl-git", help="clone (or git directory) of the Dassl fork the official code imports "
                        "(not for repositories that hold their own fork, e.g. ProGrad's)")
    parser.add_argument("--backbone", default="ViT-B/16")
    parser.add_argument("--official-side", metavar="WORKDIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.official_side:
        _official_side(args.official_side)
        return
    if args.method not in METHODS:
        parser.error(f"unknown method '{args.method}'; this tool knows {sorted(METHODS)}")
    dassl = needs_dassl(METHODS[args.method])
    if not args.official_git or (dassl and not args.dassl_git):
        parser.error(f"{args.method} needs --official-git" + (" and --dassl-git" if dassl else ""))
    fixture = compare(args.method, args.official_git, args.dassl_git, args.backbone, dict(DEFAULT_SEEDS),
                      list(DEFAULT_CLASSNAMES), METHODS[args.method].get("batch", DEFAULT_BATCH))
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    path = os.path.join(FIXTURE_DIR, f"{args.method.lower()}.json")
    with atomic_write(path, "w") as f:
        json.dump(fixture, f)
        f.write("\n")
    print(f"{args.method} vs {fixture['official_repository']}@{fixture['official_commit'][:8]}: "
          "relative max difference " + ", ".join(f"{key} {value:.2e}" for key, value in
                                                 fixture["relative_max_difference"].items()) + f"; wrote {path}")


if __name__ == "__main__":
    main()
