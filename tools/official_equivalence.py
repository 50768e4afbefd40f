"""Compare a trainer's model with its official implementation on the same random weights.

Both sides get the same inputs, all generated from seeds in this process:

* a random CLIP (``--backbone``, OpenAI layout) saved as a plain OpenAI-format state-dict file
  (values rounded to fp16 so that the official ``clip.build_model``, which casts to fp16
  before the method's ``.float()``, holds exactly the same numbers);
* the learnable values (the context ctx [n, D]) drawn with ``LEARNABLE_SCALE`` times the
  official init std, so that a token in the wrong place moves the logits;
* a batch of images [B, 3, R, R] and labels [B], and a fixed list of class names.

Ours is built with ``load_clip`` (the file as ``MODEL.BACKBONE.WEIGHTS``) and the trainer's
model class; the official code runs in a subprocess of this file (``--official-side``) with
``PYTHONPATH`` set to trees exported (``git archive HEAD``) from the official repository and
its Dassl fork into a temporary folder. In that subprocess ``clip._download`` returns the
weights file (for DePT also ``clip_maple.clip._download``, and ``plotnine`` is an empty
stand-in), and the four modules Dassl imports only for logging and for datasets it does
not use here (``torch.utils.tensorboard``, ``gdown``, ``wilds``, ``pandas``) are empty
stand-ins, so nothing is installed. The official model classes are built directly from a
Dassl config (no data loader; the images are fed as tensors), in fp32 (the official ``PREC``
fp32 branch).

Compared (``METHODS[method]["outputs"]``), each by the relative max difference
max|ours - official| / max|official|: CoOp's logits [B, C] and the batch's cross-entropy;
ProGrad's student and zero-shot logits, CE, KL and the ctx update of one official
``prograd_backward_and_update`` step under SGD at lr 1 (the projected gradient); MaPLe's logits
and CE (Koorye/DePT's trainers/maple.py, the MaPLe code DePT builds on); DePT on MaPLe's
(Koorye/DePT's trainers/elp_maple.py, run with ``DATASET.SUBSAMPLE_CLASSES`` base so the head
exists) similarity logits, head logits, fused base-role logits and training loss. For both,
every learnable value (MaPLe's prompts and couplings, FiLM γ/β, the head) is drawn away from its
init and mapped by name (``MAPLE["learnables"]``, ``DEPT_MAPLE["learnables"]``). The result
goes to ``tests/fixtures/official/<method>.json`` (seeds, class names, labels, settings,
parameter-name mapping, official outputs, official repository and commits), which
``tests/test_official_equivalence*.py`` rebuild our side against.

Usage (clones, or bare git directories, of the official repositories; HEAD is compared):

    python tools/official_equivalence.py CoOp --official-git CoOp --dassl-git Dassl.pytorch
    python tools/official_equivalence.py ProGrad --official-git Prompt-align
    python tools/official_equivalence.py MaPLe --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py DePT-MaPLe --official-git DePT --dassl-git Dassl.pytorch
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import types

import torch
import torch.nn.functional as F

from vlprompt.fileio import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_DIR = os.path.join(ROOT, "tests", "fixtures", "official")
# Learnable values are drawn with this many times the official init std.
LEARNABLE_SCALE = 10.0
# Contract tolerance: relative max difference of logits and loss.
TOLERANCE = 3e-3
DEFAULT_SEEDS = {"weights": 1, "learnable": 2, "images": 3}
DEFAULT_CLASSNAMES = ["golden retriever", "sunflower", "fire truck"]
DEFAULT_BATCH = 2

MAPLE_DEPTH = 9  # MaPLe's PROMPT_DEPTH: T_1 plus 8 deep text prompts and 8 couplings
_MAPLE_LINEAR = {"init_std": 512 ** -0.5, "shape": {"weight": ("vision_width", "width"), "bias": ("vision_width",)}}


def _maple_learnables(prefix):
    """MaPLe's learnable values: our parameter name (under ``prefix``) -> official name, shape
    (symbolic dims), init std: T_1, the couplings F_1..F_J and the deep text prompts T_2..T_J."""
    learnables = {f"{prefix}prompt_learner.ctx": {"official": "prompt_learner.ctx", "shape": ("n_ctx", "width"),
                                                  "init_std": 0.02}}
    couplings = [("proj", "proj")] + [(f"compound_prompt_projections.{i}",) * 2 for i in range(MAPLE_DEPTH - 1)]
    for ours, official in couplings:
        for kind, shape in _MAPLE_LINEAR["shape"].items():
            learnables[f"{prefix}prompt_learner.{ours}.{kind}"] = {
                "official": f"prompt_learner.{official}.{kind}", "shape": shape, "init_std": _MAPLE_LINEAR["init_std"]}
    for i in range(MAPLE_DEPTH - 1):
        learnables[f"{prefix}prompt_learner.compound_prompts_text.{i}"] = {
            "official": f"prompt_learner.compound_prompts_text.{i}", "shape": ("n_ctx", "width"), "init_std": 0.02}
    return learnables


def _dept_maple_learnables():
    """DePT on MaPLe: our parameter name -> official name, shape (symbolic dims), init mean and std.

    Ours is DePTCLIP(MaPLeCLIP) (the base under ``base.``); the official model is
    Koorye/DePT's trainers/elp_maple.CustomCLIP (MaPLe's prompt learner plus film_lp_img,
    film_lp_text and linear_probe_proj). Every value is drawn away from its init.
    """
    learnables = _maple_learnables("base.")
    for ours, official in (("film_image", "film_lp_img"), ("film_text", "film_lp_text")):
        learnables[f"{ours}.scale"] = {"official": f"{official}.scale", "shape": ("embed",), "init_mean": 1.0,
                                       "init_std": 0.02}
        learnables[f"{ours}.shift"] = {"official": f"{official}.bias", "shape": ("embed",), "init_std": 0.02}
    learnables["head.weight"] = {"official": "linear_probe_proj.weight", "shape": ("classes", "embed"),
                                 "init_std": 512 ** -0.5}
    learnables["head.bias"] = {"official": "linear_probe_proj.bias", "shape": ("classes",), "init_std": 0.02}
    return learnables


DEPT_MAPLE = {
    "repository": "Koorye/DePT",
    "code_dir": "",
    "official_module": "trainers.elp_maple",
    "dataset": "OxfordPets",
    "official_cfg": {
        "TRAINER.MAPLE": {"N_CTX": 2, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH": MAPLE_DEPTH},
        "TRAINER.LINEAR_PROBE": {"TYPE": "linear", "WEIGHT": 0.7, "TEST_TIME_FUSION": True},
        "TRAINER.FILM": {"LINEAR_PROBE": True},
    },
    "our_node": {"N_CTX": 2, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH": MAPLE_DEPTH},
    "our_dept_node": {"BASE": "MaPLe", "PREC": "fp32", "HEAD_WEIGHT": 0.7, "HEAD_LR_MULT": 6.5, "INFERENCE": "fused"},
    "learnables": _dept_maple_learnables(),
    # similarity logits [B, C], head logits h(FiLM_I(f)) [B, C], fused base-role logits [B, C],
    # one batch's loss 0.3·CE + 0.7·CE_head over [text; image]
    "outputs": ("logits", "head_logits", "fused_logits", "loss"),
}

MAPLE = {
    "repository": "Koorye/DePT",  # its trainers/maple.py: MaPLe's code, on which DePT's elp_maple builds
    "code_dir": "",
    "official_module": "trainers.maple",
    "official_cfg": {"TRAINER.MAPLE": DEPT_MAPLE["official_cfg"]["TRAINER.MAPLE"]},
    "our_node": DEPT_MAPLE["our_node"],
    "learnables": _maple_learnables(""),
    "outputs": ("logits", "loss"),
}

# Per method: official repository (and the folder of its code and of its Dassl fork inside it,
# "" = the root), the official module, its config nodes, our config node, the learnable values
# (our parameter name -> official name, official init std), the outputs compared and, where
# the default (0, 1, ...) does not serve, the batch's labels.
METHODS = {
    "CoOp": {
        "repository": "KaiyangZhou/CoOp",
        "code_dir": "",
        "official_module": "trainers.coop",
        "official_cfg": {"TRAINER.COOP": {"N_CTX": 16, "CSC": False, "CTX_INIT": "", "CLASS_TOKEN_POSITION": "end",
                                          "PREC": "fp32"}},
        "our_node": {"N_CTX": 16, "CSC": False, "CTX_INIT": "", "CLASS_TOKEN_POSITION": "end", "PREC": "fp32"},
        "learnables": {"prompt_learner.ctx": {"official": "prompt_learner.ctx", "init_std": 0.02}},
        "outputs": ("logits", "loss"),
    },
    "ProGrad": {
        "repository": "BeierZhu/Prompt-align",
        "code_dir": "ProGrad.public",
        "dassl_dir": "Dassl.ProGrad.pytorch",
        "official_module": "trainers.prograd",
        "dataset": "OxfordPets",
        "official_cfg": {
            "TRAINER.COOP": {"N_CTX": 16, "CSC": False, "CTX_INIT": True, "CLASS_TOKEN_POSITION": "end",
                             "PREC": "fp32", "ALPHA": 1.0},
            "LOSS": {"NAME": "prograd", "T": 1.0, "LAMBDA": 1.0},
        },
        "our_node": {"N_CTX": 16, "CSC": False, "CTX_INIT": True, "CLASS_TOKEN_POSITION": "end", "PREC": "fp32",
                     "LAMBDA": 1.0, "T": 1.0},
        # labels against the zero-shot teacher's preference, so that the CE and KL gradients
        # conflict and the projection acts (tests/test_official_equivalence.py checks it does)
        "labels": [0, 0],
        "learnables": {"prompt_learner.ctx": {"official": "prompt_learner.ctx", "init_std": 0.02}},
        "outputs": ("logits", "loss", "zs_logits", "kl_loss", "ctx_update"),
    },
    "MaPLe": MAPLE,
    "DePT-MaPLe": DEPT_MAPLE,
}


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
    dims = {"n_ctx": spec["our_node"]["N_CTX"], "width": width, "vision_width": 768, "embed": 512,
            "classes": n_classes}
    for name, entry in spec["learnables"].items():
        shape = tuple(dims[dim] for dim in entry.get("shape", ("n_ctx", "width")))
        learnables[name] = entry.get("init_mean", 0.0) + _normal(generator, shape, LEARNABLE_SCALE * entry["init_std"])
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


def our_outputs(method, backbone, weights_path, classnames, learnables, images, labels):
    """Our model's outputs {name in METHODS[method]["outputs"]: tensor}: logits [B, C] and the
    batch's cross-entropy "loss"; for ProGrad also the zero-shot teacher's logits [B, C], the KL
    term, "ctx_update", the projected gradient of ctx [n, D] (its update under SGD, lr 1), and
    "ctx_grad_ce", the CE gradient before the projection (not compared: it shows the projection acts)."""
    from yacs.config import CfgNode as CN

    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
    from vlprompt.project import import_project_package

    import_project_package("trainers")  # our trainers/ (the official side has its own of that name)
    if method == "DePT-MaPLe":
        return our_dept_maple_outputs(backbone, weights_path, classnames, learnables, images, labels)
    if method == "MaPLe":
        return our_maple_outputs(backbone, weights_path, classnames, learnables, images, labels)
    spec = METHODS[method]
    model_clip, _ = load_clip(backbone, weights_path)
    clip, tokenizer, node = CLIPRunner(model_clip), Tokenizer(backbone), CN(spec["our_node"])
    if method == "CoOp":
        from trainers.coop import CoOpCLIP

        model = CoOpCLIP(clip, tokenizer, classnames, node).eval()
    else:
        from trainers.prograd import ProGradCLIP, project_conflicting, template_for

        model = ProGradCLIP(clip, tokenizer, classnames, node, template_for(spec["dataset"], "")).eval()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in learnables.items():
            parameters[name].copy_(value)
    if method == "CoOp":
        with torch.no_grad():
            logits = model(images)
        return {"logits": logits, "loss": F.cross_entropy(logits, labels)}
    loss_ce, loss_kl, logits = model.losses(images, labels)
    with torch.no_grad():
        image_features = F.normalize(model.clip.encode_image(images), dim=-1)
        zs_logits = model.cosine_logits(image_features, model.zs_text_features)
    ctx = parameters["prompt_learner.ctx"]
    grad_kl, = torch.autograd.grad(loss_kl, ctx, retain_graph=True)
    grad_ce, = torch.autograd.grad(loss_ce, ctx)
    update = project_conflicting(grad_ce, grad_kl, node.LAMBDA)
    return {"logits": logits.detach(), "loss": loss_ce.detach(), "zs_logits": zs_logits,
            "kl_loss": loss_kl.detach(), "ctx_update": update, "ctx_grad_ce": grad_ce}


def our_dept_maple_outputs(backbone, weights_path, classnames, learnables, images, labels):
    """Our DePTCLIP on MaPLeCLIP (fused inference, head over the C classes): the similarity
    logits s·f̂·t̂ᵀ, the head logits h(γ_I ⊙ f + β_I), the fused logits 0.3·sim + 0.7·head
    (all [B, C]) and the training loss 0.3·CE + 0.7·CE_head over [text_y; image] of the batch."""
    from yacs.config import CfgNode as CN

    from trainers.dept import DePTCLIP
    from trainers.maple import MaPLeCLIP
    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip

    spec = METHODS["DePT-MaPLe"]
    model_clip, _ = load_clip(backbone, weights_path)
    base = MaPLeCLIP(CLIPRunner(model_clip), Tokenizer(backbone), classnames, CN(spec["our_node"]))
    node = CN(spec["our_dept_node"])
    model = DePTCLIP(base, node, node.INFERENCE, len(classnames)).eval()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in learnables.items():
            parameters[name].copy_(value)
        features = base.unnormalised_image_features(images)
        logits = model.similarity_logits(features, F.normalize(base.compute_text_features(), dim=-1))
        head_logits = model.head_logits(features)
        fused_logits = model(images)
        loss, _, _ = model.loss(images, labels)
    return {"logits": logits, "head_logits": head_logits, "fused_logits": fused_logits, "loss": loss}


def our_maple_outputs(backbone, weights_path, classnames, learnables, images, labels):
    """Our MaPLeCLIP's logits [B, C] and the batch's cross-entropy "loss"."""
    from yacs.config import CfgNode as CN

    from trainers.maple import MaPLeCLIP
    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip

    model_clip, _ = load_clip(backbone, weights_path)
    model = MaPLeCLIP(CLIPRunner(model_clip), Tokenizer(backbone), classnames, CN(MAPLE["our_node"])).eval()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in learnables.items():
            parameters[name].copy_(value)
        logits = model(images)
    return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


def _prepare_official_maple(cfg, weights_path):
    """Koorye/DePT's MaPLe loads CLIP through its own ``clip_maple`` package; DePT's head needs the base split."""
    from clip_maple import clip as official_clip_maple

    official_clip_maple._download = lambda url, root=None: weights_path
    cfg.DATASET.SUBSAMPLE_CLASSES = "base"  # the head exists (and the forward fuses) for base classes
    sys.modules["plotnine"] = types.ModuleType("plotnine")  # imported (*) by elp_*.py, unused here


def _official_dept_maple_outputs(model, images, labels):
    """The official elp_maple CustomCLIP's similarity, head and fused logits (eval) and its
    training loss (train mode: ``forward(img, labels)`` returns the loss)."""
    with torch.no_grad():
        text_feats, img_feats = model._forward_feats(images)
        logits = model._forward_logits_similarity(text_feats, img_feats)
        head_logits, _ = model._forward_logits_linear_probe(text_feats, img_feats, None)
        fused_logits = model(images)
        model.train()
        loss = model(images, labels)
        model.eval()
    return {"logits": logits, "head_logits": head_logits, "fused_logits": fused_logits, "loss": loss}


def _install_stand_ins():
    """Empty modules for what Dassl imports only for logging and for datasets not used here."""
    import torchvision.ops  # noqa: F401  (imported before the stand-ins: torch._dynamo looks modules up)

    for name, attributes in (("torch.utils.tensorboard", {"SummaryWriter": None}), ("gdown", {}),
                             ("wilds", {"get_dataset": None}), ("pandas", {})):
        stand_in = types.ModuleType(name)
        stand_in.__dict__.update(attributes)
        sys.modules[name] = stand_in


def _official_side(workdir):
    """Run in the subprocess: build the official model from ``workdir``'s request, write its outputs."""
    _install_stand_ins()
    import importlib

    from clip import clip as official_clip
    from dassl.config import get_cfg_default
    from yacs.config import CfgNode as CN

    with open(os.path.join(workdir, "request.json")) as f:
        request = json.load(f)
    spec = METHODS[request["method"]]
    weights_path = os.path.join(workdir, "weights.pt")
    official_clip._download = lambda url, root=None: weights_path
    inputs = torch.load(os.path.join(workdir, "inputs.pt"), weights_only=True)
    images, labels = inputs["images"], inputs["labels"]

    cfg = get_cfg_default()
    for path, values in spec["official_cfg"].items():
        parent = cfg
        for part in path.split(".")[:-1]:
            parent = getattr(parent, part)
        setattr(parent, path.split(".")[-1], CN(values))
    cfg.MODEL.BACKBONE.NAME = request["backbone"]
    cfg.INPUT.SIZE = (images.shape[-1], images.shape[-1])
    cfg.DATASET.NAME = spec.get("dataset", "")
    if request["method"] in ("MaPLe", "DePT-MaPLe"):
        _prepare_official_maple(cfg, weights_path)
    module = importlib.import_module(spec["official_module"])
    clip_model = module.load_clip_to_cpu(cfg).float()  # the official PREC fp32 branch
    # .float(): MaPLe's prompt learner casts its coupling F_1 to fp16 after the model's cast
    model = module.CustomCLIP(cfg, request["classnames"], clip_model).float().eval()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for ours, entry in spec["learnables"].items():
            parameters[entry["official"]].copy_(inputs["learnables"][ours])
    if request["method"] in ("CoOp", "MaPLe"):
        with torch.no_grad():
            logits = model(images)
        outputs = {"logits": logits, "loss": F.cross_entropy(logits, labels)}
    elif request["method"] == "DePT-MaPLe":
        outputs = _official_dept_maple_outputs(model, images, labels)
    else:
        outputs = _official_prograd_step(module, cfg, request, model, images, labels)
    with atomic_write(os.path.join(workdir, "official.pt")) as f:
        torch.save(outputs, f)


def _official_prograd_step(module, cfg, request, model, images, labels):
    """ProGrad's forward_backward (fp32 branch) on one batch, with its Dassl TrainerBase's
    prograd_backward_and_update and SGD at lr 1, so the ctx update is the projected gradient."""
    from dassl.engine.trainer import TrainerBase

    zs_clip = module.CLIP(cfg, request["classnames"])
    logits = model(images)
    with torch.no_grad():
        zs_logits = zs_clip(images)
    loss_ce, loss_kl = module.ProGradLoss(T=cfg.LOSS.T)(logits, zs_logits.detach(), labels)
    for name, param in model.named_parameters():
        param.requires_grad_("prompt_learner" in name)
    trainer = TrainerBase()  # holds prograd_backward_and_update and the model registry
    trainer.register_model("prompt_learner", model.prompt_learner,
                           torch.optim.SGD(model.prompt_learner.parameters(), lr=1.0), None)
    before = model.prompt_learner.ctx.detach().clone()
    trainer.prograd_backward_and_update(loss_ce, loss_kl, cfg.LOSS.LAMBDA)
    return {"logits": logits.detach(), "loss": loss_ce.detach(), "zs_logits": zs_logits, "kl_loss": loss_kl.detach(),
            "ctx_update": before - model.prompt_learner.ctx.detach()}


def _rounded(tensor):
    """A tensor as nested lists of floats with 7 significant digits (float32's precision)."""
    values = tensor.detach().double().flatten().tolist()
    rounded = torch.tensor([float(f"{value:.7g}") for value in values], dtype=torch.float64)
    return rounded.view(tensor.shape).tolist()


def _export(git_dir, target):
    """``git archive HEAD`` of ``git_dir`` into ``target``; return the commit."""
    found = subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"'{git_dir}' is not a git repository with a commit ({found.stderr.strip()}); "
                         "give a clone (or the git directory) of the official repository.")
    commit = found.stdout.strip()
    os.makedirs(target)
    archive = subprocess.run(["git", "-C", git_dir, "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    return commit


def compare(method, official_git, dassl_git, backbone, seeds, classnames, batch):
    """Run both sides; return the fixture dict (with the measured differences)."""
    for label, path in (("--official-git", official_git), ("--dassl-git", dassl_git)):
        if path is not None and not os.path.isdir(path):
            raise SystemExit(f"{label} '{path}' is not a folder; "
                             "give a clone (or the git directory) of the repository.")
    spec = METHODS[method]
    with tempfile.TemporaryDirectory(prefix="official_equivalence_") as workdir:
        official_commit = _export(official_git, os.path.join(workdir, "official"))
        code_path = os.path.join(workdir, "official", spec["code_dir"])
        if "dassl_dir" in spec:
            dassl_commit, dassl_path = official_commit, os.path.join(workdir, "official", spec["dassl_dir"])
        else:
            dassl_path = os.path.join(workdir, "dassl")
            dassl_commit = _export(dassl_git, dassl_path)
        request = {"method": method, "backbone": backbone, "classnames": classnames, "seeds": seeds, "batch": batch}
        weights_path, learnables, images, labels = fixture_inputs(request, workdir)
        with atomic_write(os.path.join(workdir, "inputs.pt")) as f:
            torch.save({"learnables": learnables, "images": images, "labels": labels}, f)
        with atomic_write(os.path.join(workdir, "request.json"), "w") as f:
            json.dump(request, f)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([code_path, dassl_path]))
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
    needs_dassl = "dassl_dir" not in METHODS[args.method]
    if not args.official_git or (needs_dassl and not args.dassl_git):
        parser.error(f"{args.method} needs --official-git" + (" and --dassl-git" if needs_dassl else ""))
    fixture = compare(args.method, args.official_git, args.dassl_git, args.backbone, dict(DEFAULT_SEEDS),
                      list(DEFAULT_CLASSNAMES), DEFAULT_BATCH)
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
