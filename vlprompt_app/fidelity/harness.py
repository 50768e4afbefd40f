"""One method's comparison with its official code: the shared inputs, our side, the official side and the fixture.

Both sides get the same inputs, all generated from seeds:

* a random CLIP (the fixture's backbone, OpenAI layout; ``weights.py``): our side builds it in
  memory, the official side reads it from a state-dict file;
* the learnable values {our name: tensor}, drawn at ``LEARNABLE_SCALE`` times the official init
  std (``MethodSpec.learnables``) so that a value in the wrong place moves the outputs;
* a batch of images [B, 3, R, R] and labels [B], and a fixed list of class names.

``record`` runs the official code in a subprocess (``python -m vlprompt_app.fidelity.side
official``, the exported official trees first on that process's PYTHONPATH) and our side here,
and returns the fixture (tests/fixtures/official/<stem>.json): seeds, class names, labels,
settings, the parameter mapping, the official outputs (7 significant digits), the official
repository and commits, and the measured relative max differences. ``Comparison`` rebuilds our
side of a fixture once and runs it with the recorded values or with a ``Mutation`` of them.
"""
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import torch

from vlprompt.fileio import atomic_write
from vlprompt.paths import repository_root

from .export import export_trees
from .kept import keep_tower_runs
from .methods import METHODS, method_of_fixture
from .spec import DEFAULT_BACKBONE, DEFAULT_CLASSNAMES, LEARNABLE_SCALE
from .weights import backbone_and_size, seeded_clip, seeded_dimensions, write_weights

FIXTURE_DIR = os.path.join(str(repository_root()), "tests", "fixtures", "official")


def relative_max_difference(ours, official):
    """max|ours - official| / max|official| of two tensors of the same shape (0 for equal ones)."""
    ours, official = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(official, dtype=torch.float64)
    if ours.shape != official.shape:
        raise ValueError(f"Shapes differ: ours {tuple(ours.shape)}, official {tuple(official.shape)}.")
    return ((ours - official).abs().max() / official.abs().max().clamp_min(1e-12)).item()


def rounded(tensor):
    """A tensor as nested lists of floats with 7 significant digits (float32's precision)."""
    values = tensor.detach().double().flatten().tolist()
    values = torch.tensor([float(f"{value:.7g}") for value in values], dtype=torch.float64)
    return values.view(tensor.shape).tolist()


def load_fixture(stem):
    """The fixture dict of tests/fixtures/official/<stem>.json: method, backbone, seeds, batch,
    classnames, labels, official_outputs, relative_max_difference, official_repository, ..."""
    path = os.path.join(FIXTURE_DIR, f"{stem}.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no fixture {path}; record it with tools/official_equivalence.py")
    with open(path) as f:
        return json.load(f)


def make_inputs(spec, resolution, width, seeds, batch, n_classes):
    """Seeded learnable values {our name: tensor}, images [B, 3, R, R] and labels [B] of ``spec``."""
    learnables = {}
    if spec.learnables:
        generator = torch.Generator().manual_seed(seeds["learnable"])
        dims = {"n_ctx": spec.our_node.get("N_CTX"), "width": width, "vision_width": 768, "embed": 512,
                "classes": n_classes}
        for name, entry in spec.learnables.items():
            shape = tuple(dim if isinstance(dim, int) else dims[dim] for dim in entry.shape)
            value = entry.init_mean + torch.randn(shape, generator=generator) * LEARNABLE_SCALE * entry.init_std
            learnables[name] = value.half().float() if entry.fp16 else value
    generator = torch.Generator().manual_seed(seeds["images"])
    images = torch.randn((batch, 3, resolution, resolution), generator=generator)
    labels = torch.tensor(list(spec.labels)) if spec.labels is not None else torch.arange(batch) % n_classes
    return learnables, images, labels


def build_ours(spec, backbone, seed, classnames, node_changes=None):
    """Our model of ``spec`` on the seeded random CLIP, and its config node (``spec.our_node`` with
    ``node_changes``). The CLIP's modules are the model's own, its weights those of the draw every
    model built here shares (our side reads them; ``seeded_clip`` raises once they were written), but
    for the learnable ones (FLYP's logit scale), which are the model's own copies. The
    runner's towers keep the runs the model repeats on equal inputs (``kept.keep_tower_runs``)."""
    from yacs.config import CfgNode as CN

    from vlprompt.clip import CLIPRunner, Tokenizer
    from vlprompt_app.project import import_project_package

    import_project_package("trainers")
    node = CN(dict(spec.our_node, **(node_changes or {})))
    runner = keep_tower_runs(CLIPRunner(seeded_clip(backbone, seed, shared=True)))
    model = spec.build_ours(runner, Tokenizer(backbone_and_size(backbone)[0]), list(classnames), node, spec)
    for name, parameter in model.named_parameters():  # written before each run: memory of their own
        if name in spec.learnables:
            torch.utils.swap_tensors(parameter, torch.nn.Parameter(parameter.detach().clone(),
                                                                   requires_grad=parameter.requires_grad))
    return model.eval(), node


def run_ours(spec, model, node, learnables, images, labels, outputs=None):
    """Our outputs {name: tensor}: every learnable value written into ``model``, the model put in eval
    mode (which drops the text features cached from the previous values), then ``spec.run_ours``.
    ``outputs``: the names the caller reads (default every output), all of which are computed (a
    spec's ``on_demand_outputs`` only then)."""
    parameters = dict(model.named_parameters())
    missing = sorted(set(learnables) - set(parameters))
    if missing:
        raise KeyError(f"{spec.name}: our model has no parameters {missing}")
    with torch.no_grad():
        for name, value in learnables.items():
            parameters[name].copy_(value)
    model.eval()
    if not spec.on_demand_outputs:
        return spec.run_ours(model, node, images, labels)
    asked = tuple(spec.outputs if outputs is None else outputs)
    ours = spec.run_ours(model, node, images, labels, outputs=asked)
    missing = [key for key in asked if key not in ours]
    if missing:
        raise KeyError(f"{spec.name}: run_ours left out the asked outputs {missing}")
    return ours


class Comparison:
    """Our side of one fixture, built once: the spec, the fixture, the inputs rebuilt from its seeds
    (``learnables``, ``images`` [B, 3, R, R], ``labels`` [B]) and our ``outputs`` with them."""

    def __init__(self, stem):
        self.fixture = load_fixture(stem)
        self.spec = method_of_fixture(stem)
        backbone, seeds = self.fixture["backbone"], self.fixture["seeds"]
        resolution, width = seeded_dimensions(backbone, seeds["weights"])
        self.learnables, self.images, self.labels = make_inputs(
            self.spec, resolution, width, seeds, self.fixture["batch"], len(self.fixture["classnames"]))
        if self.labels.tolist() != self.fixture["labels"]:
            raise ValueError(f"{stem}: the labels {self.labels.tolist()} are not the fixture's "
                             f"{self.fixture['labels']}")
        self.model, self.node = self._build()
        self._built_buffers = {name: buffer.clone() for name, buffer in self.model.named_buffers()}
        self.outputs = run_ours(self.spec, self.model, self.node, self.learnables, self.images, self.labels)

    def _build(self, node_changes=None):
        return build_ours(self.spec, self.fixture["backbone"], self.fixture["seeds"]["weights"],
                          self.fixture["classnames"], node_changes)

    def _restore_buffers(self):
        """The built model's buffers as they were before its first run: a run in training mode updates
        statistics (PromptKD's BatchNorm), which the next run would otherwise start from. Only buffers
        that differ are written (a write bumps a tensor's version, which kept runs read)."""
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                built = self._built_buffers.get(name)
                if built is not None and not torch.equal(buffer, built):
                    buffer.copy_(built)

    def differences(self, outputs, keys=None):
        """{output: relative max difference of ``outputs`` to the official ones}."""
        official = self.fixture["official_outputs"]
        return {key: relative_max_difference(outputs[key], official[key]) for key in (keys or official)}

    def run(self, mutation):
        """Our outputs under ``mutation``: its values written into the built model (the recorded ones
        written back after; its buffers as before its first run), or a model rebuilt with its node
        changes and patch; the outputs its check reads (``mutation.read``), or more."""
        values = mutation.values(self.learnables) if mutation.values is not None else self.learnables
        if not mutation.rebuilds:
            self._restore_buffers()
            node = self.node.clone()
            node.merge_from_list([item for key, value in mutation.node.items() for item in (key, value)])
            try:
                return run_ours(self.spec, self.model, node, values, self.images, self.labels, mutation.read)
            finally:
                with torch.no_grad():
                    parameters = dict(self.model.named_parameters())
                    for name, value in self.learnables.items():
                        parameters[name].copy_(value)
        with mutation.patch() if mutation.patch is not None else contextlib.nullcontext():
            model, node = self._build(mutation.node)
            return run_ours(self.spec, model, node, values, self.images, self.labels, mutation.read)


def our_outputs_for_record(spec, backbone, seeds, classnames, learnables, images, labels):
    """Our outputs {name: tensor} of a freshly built model with ``learnables``."""
    model, node = build_ours(spec, backbone, seeds["weights"], classnames)
    return run_ours(spec, model, node, learnables, images, labels)


def record(method, official_git, dassl_git, backbone=DEFAULT_BACKBONE, classnames=DEFAULT_CLASSNAMES):
    """Run both sides of ``method``; return the fixture dict (with the measured differences)."""
    spec = METHODS[method]
    if not spec.compared:
        raise SystemExit(f"{method}'s spec only times its official step (tools/benchmark.py official); its "
                         f"official comparison is {spec.compared_by}.")
    seeds, classnames, batch = dict(spec.seeds), list(classnames), spec.batch
    with tempfile.TemporaryDirectory(prefix="official_equivalence_") as workdir:
        official_commit, dassl_commit, paths = export_trees(spec, official_git, dassl_git, workdir)
        request = {"method": method, "backbone": backbone, "classnames": classnames, "seeds": seeds, "batch": batch}
        resolution, width = write_weights(backbone, seeds["weights"], os.path.join(workdir, "weights.pt"))
        learnables, images, labels = make_inputs(spec, resolution, width, seeds, batch, len(classnames))
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save({"learnables": learnables, "images": images, "labels": labels}, f)
        with atomic_write(os.path.join(workdir, "request.json"), "w") as f:
            json.dump(request, f)
        official = run_official_process(["official", workdir, method], paths, workdir)
        ours = our_outputs_for_record(spec, backbone, seeds, classnames, learnables, images, labels)
    return {
        "method": method,
        "official_repository": spec.repository,
        "official_commit": official_commit,
        "dassl_commit": dassl_commit,
        "backbone": backbone,
        "seeds": seeds,
        "batch": batch,
        "classnames": classnames,
        "labels": labels.tolist(),
        "learnable_scale": LEARNABLE_SCALE,
        "official_cfg": dict(spec.official_cfg),
        "our_node": dict(spec.our_node),
        "parameter_mapping": spec.parameter_mapping(),
        "official_outputs": {key: rounded(official[key]) for key in spec.outputs},
        "relative_max_difference": {key: relative_max_difference(ours[key], official[key]) for key in spec.outputs},
    }


def side_command(arguments):
    """The command of a subprocess side: ``python -P -m vlprompt_app.fidelity.side ARGUMENTS`` (``-P``: the
    working folder is not put on sys.path)."""
    return [sys.executable, "-P", "-m", "vlprompt_app.fidelity.side", *arguments]


def side_environment(official_paths):
    """The side's environment: PYTHONPATH the official trees first, then this repository, then the
    caller's PYTHONPATH (packages installed beside the environment, as on the GPU machine)."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*official_paths, str(repository_root()), *inherited]))


def run_official_process(arguments, official_paths, workdir):
    """Run the official side of an equivalence in a subprocess; its outputs {name: tensor}."""
    command, env = side_command(arguments), side_environment(official_paths)
    if subprocess.run(command, env=env, cwd=workdir).returncode != 0:
        raise SystemExit(f"The official side failed (its traceback is above): {' '.join(command)} "
                         f"with PYTHONPATH={env['PYTHONPATH']}.")
    return torch.load(os.path.join(workdir, "official.pt"), weights_only=True)


def official_outputs(workdir, method):
    """In the subprocess: build the official model from ``workdir``'s request and inputs, write its
    outputs to ``workdir``/official.pt."""
    from .official_env import install_stand_ins, official_setup

    with open(os.path.join(workdir, "request.json")) as f:
        request = json.load(f)
    weights_path = os.path.join(workdir, "weights.pt")
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    images, labels = inputs["images"], inputs["labels"]
    spec = METHODS[method]
    if spec.official_side is not None:  # official code without Dassl: the method builds and runs it itself
        install_stand_ins()
        outputs = spec.official_side(request, weights_path, inputs)
    else:
        cfg, module, _ = official_setup(spec, request["backbone"], images.shape[-1], weights_path)
        clip_model = module.load_clip_to_cpu(cfg).float()  # the official PREC fp32 branch
        if spec.build_official is not None:
            model = spec.build_official(module, cfg, request["classnames"], clip_model)
        else:
            # .float(): MaPLe's prompt learner casts its coupling F_1 to fp16 after the model's cast
            model = module.CustomCLIP(cfg, request["classnames"], clip_model).float().eval()
        parameters = dict(model.named_parameters())
        learned = {name for name in parameters if spec.is_official_learnable(name)} - set(spec.official_unused)
        mapped = set(spec.parameter_mapping().values())
        if learned != mapped:
            raise SystemExit(f"The official learnable parameters and the {method} spec differ: official only "
                             f"{sorted(learned - mapped)}, mapped only {sorted(mapped - learned)}.")
        with torch.no_grad():
            for ours, entry in spec.learnables.items():
                target = parameters[entry.official]
                target.copy_(inputs["learnables"][ours].view_as(target))  # e.g. a Linear's weight into a 1x1 conv's
        outputs = spec.run_official(module, cfg, request, model, images, labels)
    with atomic_write(os.path.join(workdir, "official.pt")) as f:
        torch.save(outputs, f)


def write_fixture(fixture, stem):
    """Write ``fixture`` to tests/fixtures/official/<stem>.json; return the path."""
    os.makedirs(FIXTURE_DIR, exist_ok=True)
    path = os.path.join(FIXTURE_DIR, f"{stem}.json")
    with atomic_write(path, "w") as f:
        json.dump(fixture, f)
        f.write("\n")
    return path

