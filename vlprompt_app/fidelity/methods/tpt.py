"""TPT and CoCoOp+TPT against azshue/TPT (tpt_classification.py, clip/custom_clip.py, clip/cocoop.py).

Both sides get the same 64 view tensors (``batch``: the harness's seeded images; view 0 is the
test view) and one episode runs: the official ``select_confident_samples`` / ``avg_entropy`` on
the model's logits of all views give the kept views and the loss, its ``test_time_tuning`` takes
the AdamW step (its GradScaler is disabled on the CPU), then the test view is predicted. Compared:
the kept views (their indices in increasing order, exactly: which views enter the loss; the
official argsort lists them by entropy, and two kept views whose entropies differ by fp32 rounding
may come out in either order), the loss, the tuned context and the test view's logits.

* ``TPT``: ``ClipTestTimeTuning`` with n_ctx 4 and ctx_init "a_photo_of_a" (scripts/test_tpt.sh);
  its ``prompt_learner.ctx`` is the learnable value (CoOp+TPT only loads a trained one into it).
* ``TPT-CoCoOp``: ``CoCoOpCLIP`` (n_ctx 4, "a_photo_of_a"; scripts/test_tpt_cocoop.sh) with the
  context and the meta-net as learnable values; its ``gen_ctx`` gives ctx + π(f_0) (f_0 not
  normalised), which ``test_time_tuning`` tunes with a fresh AdamW.

The official tree's ``clip`` package imports its CoOp/CoCoOp modules and their class-name lists;
the official models load CLIP themselves with ``clip.load``, whose state-dict branch is broken
upstream (``prepare_official`` gives them that branch as written: ``build_model`` + ``.float()``). The official main sets requires_grad only
on the prompt learner (TPT) / nothing but the text encoder (CoCoOp); ``build_official`` does the same.

For tools/benchmark.py official, TPT's unit of cost is one test image's episode on ``views`` (64,
the recipe's) views, ``official_step_side``: the body of upstream's ``test_time_adapt_eval`` for
one image: ``model.reset()``, the optimizer's initial state loaded, ``test_time_tuning`` (1 step;
every view through the image tower, the 50 class prompts through the text tower, backward, AdamW)
and the prediction ``model(image)`` of view 0 (image tower again, text tower with the tuned
prompt). Ours is the case's trainer (configs/trainers/TPT/vit_b16.yaml, fp32) and its
``adapt_and_predict`` of the same views.
"""
import argparse
import contextlib
import hashlib

import torch

from ..spec import CostSpec, Learnable, MethodSpec, Mutation, flip

N_CTX, LR, SELECTION = 4, 5e-3, 0.1
VIEWS = 64
NODE = {"N_CTX": N_CTX, "CTX_INIT": "a photo of a", "CSC": False, "CLASS_TOKEN_POSITION": "end", "PREC": "fp32",
        "TEXT_CHUNK_SIZE": 256, "NUM_VIEWS": VIEWS, "SELECTION": SELECTION, "STEPS": 1, "LR": LR,
        "WEIGHT_DECAY": 0.01}


def prepare_official(cfg, weights_path):
    """Upstream's ``clip.load`` reads only JIT archives (for a state-dict file it reads ``model``
    before assigning it); its non-JIT branch, ``build_model(state_dict)`` then ``.float()`` on the
    CPU, is given to the modules that imported ``load``."""
    import clip.cocoop as cocoop
    import clip.custom_clip as custom_clip
    from clip import clip as official_clip

    def load(name, device="cpu", jit=False, download_root=None):
        state_dict = torch.load(weights_path, map_location="cpu", weights_only=True)
        model = official_clip.build_model(state_dict).to(device).float()
        return model, state_dict["text_projection"].shape[1], None

    custom_clip.load = cocoop.load = load
    custom_clip.load_clip_to_cpu = lambda cfg: load("ViT-B/16")[0]


def build_ours(clip, tokenizer, classnames, node, spec):
    """CoOpCLIP or CoCoOpCLIP, frozen; its frozen image tower's features of the last views kept, so
    that the runs on one model (the recorded values, then the mutations, which move the text side
    only) encode the 64 views once, and so do TPT and TPT-CoCoOp (the same views and seeded CLIP)."""
    from vlprompt.methods.conditional_context import CoCoOpCLIP
    from vlprompt.methods.text_context import CoOpCLIP

    model = (CoCoOpCLIP if spec.options["prompt"] == "cocoop" else CoOpCLIP)(clip, tokenizer, classnames, node)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    clip.encode_image = _kept_features(clip.encode_image, clip.visual)
    return model


# The image features [B, E] last encoded by a model of ``build_ours``, with the digest of the tower's
# weights and of the images they came from (another model of this process with equal weights reuses them).
_SHARED = {}


def _digest(tensors):
    """A digest of the dtypes, shapes and bytes of ``tensors``."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        tensor = tensor.detach().cpu()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _kept_features(encode_image, tower):
    """``encode_image`` that returns the previous features [B, E] when called again with the same,
    unchanged images tensor [B, 3, R, R] (the same object and version) and the tower gives no gradient,
    or the features ``_SHARED`` holds for the same bytes of images and of ``tower``'s weights."""
    kept = {}

    def encode(images):
        if kept.get("images") is images and kept["version"] == images._version:
            return kept["features"]
        key = (_digest(tower.state_dict().values()), _digest([images]))
        features = _SHARED["features"] if _SHARED.get("key") == key else encode_image(images)
        if not features.requires_grad:
            kept.update(images=images, version=images._version, features=features)
            _SHARED.update(key=key, features=features)
        return features

    return encode


def _view_set(kept):
    """The kept views' indices [K] in increasing order, as floats (the fixture's number format)."""
    return kept.sort().values.float()


def run_ours(model, node, images, labels, prompt="coop"):
    from vlprompt.methods.prompt_tuning import PromptTuning

    tuning = PromptTuning(model, prompt, node, contextlib.nullcontext)
    tuning.snapshot()
    with torch.no_grad():
        logits = tuning(images)
    tuned = tuning.last["tuned"]["prompt_learner.ctx" if prompt == "coop" else "context"]
    return {"kept": _view_set(tuning.last["kept"]), "loss": tuning.last["loss"], "ctx": tuned, "logits": logits}


def run_ours_cocoop(model, node, images, labels):
    return run_ours(model, node, images, labels, prompt="cocoop")


def build_official(module, cfg, classnames, clip_model):
    model = module.ClipTestTimeTuning("cpu", classnames, None, arch="ViT-B/16", n_ctx=N_CTX, ctx_init="a_photo_of_a")
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("prompt_learner" in name)
    return model.float().eval()


def build_official_cocoop(module, cfg, classnames, clip_model):
    import clip.cocoop as official_cocoop

    model = official_cocoop.CoCoOpCLIP("cpu", classnames, arch="ViT-B/16", n_ctx=N_CTX)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("text_encoder" in name)
    return model.float().eval()


def _episode_args(cocoop):
    return argparse.Namespace(cocoop=cocoop, tta_steps=1, selection_p=SELECTION, lr=LR)


def run_official(module, cfg, request, model, images, labels):
    import tpt_classification as tpt

    with torch.no_grad():
        selected, kept = tpt.select_confident_samples(model(images), SELECTION)
        loss = tpt.avg_entropy(selected)
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), LR)
    scaler = torch.cuda.amp.GradScaler(init_scale=1000)  # disabled without CUDA
    tpt.test_time_tuning(model, images, optimizer, scaler, _episode_args(False))
    with torch.no_grad():
        logits = model(images[:1])[0]
    return {"kept": _view_set(kept), "loss": loss, "ctx": model.prompt_learner.ctx.detach().clone(), "logits": logits}


def run_official_cocoop(module, cfg, request, model, images, labels):
    import tpt_classification as tpt

    with torch.no_grad():
        image_features, context = model.gen_ctx(images, True)
        selected, kept = tpt.select_confident_samples(model((image_features, context)), SELECTION)
        loss = tpt.avg_entropy(selected)
    scaler = torch.cuda.amp.GradScaler(init_scale=1000)  # disabled without CUDA
    context = tpt.test_time_tuning(model, (image_features, context), None, scaler, _episode_args(True))
    with torch.no_grad():
        logits = model((image_features[:1], context))[0]
    return {"kept": _view_set(kept), "loss": loss, "ctx": context.detach()[0], "logits": logits}


def official_step_side(request, weights_path, inputs):
    """In the benchmark's subprocess: (one TPT episode on the views, the episode's optimizer)."""
    import tpt_classification as tpt

    from .common import official_dassl_model, official_episode

    views = inputs["images"]
    _, _, model = official_dassl_model(SPECS[0], request, weights_path, views.shape[-1])
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), LR)
    scaler = torch.cuda.amp.GradScaler(init_scale=1000)  # disabled without CUDA
    args = _episode_args(False)

    return official_episode(model, tpt.test_time_tuning, views, optimizer, scaler, args), optimizer


def _spec(name, prompt, learnables, run_ours, build_official, run_official, **fields):
    return MethodSpec(
        name=name,
        repository="azshue/TPT",
        official_module="clip.custom_clip",
        batch=VIEWS,
        outputs=("kept", "loss", "ctx", "logits"),
        exact_outputs=("kept",),
        build_ours=build_ours,
        prepare_official=prepare_official,
        options={"prompt": prompt},
        our_node=dict(NODE),
        learnables=learnables,
        run_ours=run_ours,
        build_official=build_official,
        run_official=run_official,
        # the reversed context: another episode, whose tuned context and prediction differ
        mutations=(Mutation("context reversed", values=flip("prompt_learner.ctx"), fails=("logits", "ctx")),),
        **fields,
    )


_META_NET = {"linear1.weight": (32, "embed"), "linear1.bias": (32,), "linear2.weight": ("width", 32),
             "linear2.bias": ("width",)}
SPECS = (
    _spec("TPT", "coop", {"prompt_learner.ctx": Learnable("prompt_learner.ctx", 0.02)}, run_ours, build_official,
          run_official, cost=CostSpec(step_side=official_step_side, views=VIEWS, our_nodes={})),  # our case: the recipe
    _spec("TPT-CoCoOp", "cocoop", dict(
        {"prompt_learner.ctx": Learnable("prompt_generator.ctx", 0.02)},
        **{f"prompt_learner.meta_net.{name}": Learnable(f"prompt_generator.meta_net.{name}", 0.002, shape)
           for name, shape in _META_NET.items()}),
        run_ours_cocoop, build_official_cocoop, run_official_cocoop,
        official_learnable_prefixes=("prompt_generator.",)),
)
