"""PromptAlign against jameelhassan/PromptAlign's trainers/prompt_align.py: the source statistics and one
test-time step.

Both sides get the same MaPLe prompts (depth 3, T_k and F_k drawn away from their inits) and the
same image tensors: the first ``SOURCE_IMAGES`` stand for the source training set, the other
``VIEWS`` are one test image's views (view 0 the test view). Compared:

* ``source_means`` / ``source_variances``: the token statistics of the source images (upstream
  ships no script; its README and issue #5 describe the pass: the inference forward, the blocks'
  stored inputs ``visual_feat`` averaged over the images, then the squared deviations from that
  mean averaged), blocks 0 and 1, every token, the first ``CHANNELS`` channels (the fixture stays small);
* ``view_means`` / ``view_variances``: the statistics of the kept views in the step (the same slice);
* ``alignment`` (weighted, (100/3)·Σ_{l∈{0,1}} ...), ``loss`` (entropy + alignment) of the step;
* ``text_prompts`` [3, 2, 512] and ``vision_prompts`` [3, 2, 768] (= F_k(T_k)) after the AdamW step;
* ``logits`` [1, C] of the test view after the step.

The official step is its own ``PromptAlign.test_time_tuning`` (its avg_entropy, select_confident_samples
and distr_align_loss, with the TPT config node of its DG config but 8 views and thresholds 0.25, so 2
views are kept) called on a trainer object holding only the statistics; its loss terms are read by
wrapping those two methods. The official trainer module imports TPT's ``dassl.utils.tpt_tools`` (from
its own Dassl fork, not public) and ``fvcore`` for names this comparison never calls: stand-ins.

For tools/benchmark.py official, the unit of cost is one test image's episode on ``BENCHMARK_VIEWS``
(64) views with the recipe's thresholds (0.1: 6 views kept), ``official_step_side``: the body of
``PromptAlign.test_time_adapt_eval`` for one image (``model.reset()``, the optimizer's initial
state loaded, ``test_time_tuning``: the prompted model's forward of every view with autograd, the
entropy and the alignment of the kept views' block statistics, backward through the image tower,
AdamW; then ``model(image)`` of view 0), on stand-in source statistics (zero means, unit
variances, as our case's). Ours: the case's trainer (configs/trainers/PromptAlign/vit_b16.yaml, fp32)
and its ``adapt_and_predict`` of the same views.
"""
import sys
import types

import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from ..spec import CostSpec, MethodSpec, Mutation, swap
from .maple import learnables as maple_learnables

DEPTH = 3
SOURCE_IMAGES = 4
VIEWS = 8
SELECTION = 0.25  # 2 of the 8 views
NODE = {"N_CTX": 2, "CTX_INIT": "a photo of a", "PREC": "fp32", "PROMPT_DEPTH": DEPTH}
# our TRAINER.PROMPTALIGN: the official recipe (configs/trainers/PromptAlign/vit_b16.yaml) with 8 views
OUR_NODE = dict(NODE, SELECTION=SELECTION, STEPS=1, LR=0.04, WEIGHT_DECAY=0.01, ALIGN_LAYERS=[0, 1],
                ALIGN_WEIGHT=100.0 / 3)
CHANNELS = 4  # channels of the token statistics kept in the fixture
ALIGN_LAYERS = (0, 1)
# upstream's TPT node (its trainers/PromptAlign/DG_PAlign_vit_b16_c2_ep5_batch4_2ctx_cross_datasets.yaml config)
# with the thresholds for 8 views
OFFICIAL_TPT = {"LOADER": True, "RUN": True, "LR": 4e-2, "COCOOP": False, "ALIGN_LAYER_FROM": 0, "ALIGN_LAYER_TO": 3,
                "TTA_STEPS": 1, "DISTR_ALIGN": True, "TPT_THRESHOLD": SELECTION, "ALIGN_THRESHOLD": SELECTION,
                "TPT_LOSS": True, "DISTR_LOSS_W": 100.0, "BATCH_SIZE": VIEWS}


def _slice(statistics):
    """The aligned blocks (0 and 1 of a [blocks, L, D] tensor, or a {block: [L, D]} dict's blocks), every
    token, the first CHANNELS channels: [2, L, CHANNELS]."""
    layers = sorted(statistics) if isinstance(statistics, dict) else ALIGN_LAYERS
    return torch.stack([statistics[layer][:, :CHANNELS] for layer in layers])


def build_ours(clip, tokenizer, classnames, node, spec):
    from trainers.promptalign import PromptAlignCLIP

    return PromptAlignCLIP(clip, tokenizer, classnames, node, node.ALIGN_LAYERS).requires_grad_(False)


def run_ours(model, node, images, labels):
    from contextlib import nullcontext

    from trainers.promptalign import AlignedPromptTuning, TokenStatistics, image_features_and_block_inputs

    source, views = images[:SOURCE_IMAGES], images[SOURCE_IMAGES:]
    statistics = TokenStatistics()
    with torch.no_grad():
        statistics.add(image_features_and_block_inputs(model, source, range(model.clip.visual.num_layers))[1])
    tuning = AlignedPromptTuning(model, node, node, nullcontext)
    tuning.source_means, tuning.source_variances = statistics.result()
    tuning.snapshot()
    with torch.no_grad():
        logits = tuning(views).unsqueeze(0)
    tuned = {name[len("prompt_learner."):]: value for name, value in tuning.last["tuned"].items()}
    couplings = [("proj", "ctx")] + [(f"compound_prompt_projections.{i}", f"compound_prompts_text.{i}")
                                     for i in range(DEPTH - 1)]
    vision = torch.stack([F.linear(tuned[text], tuned[f"{coupling}.weight"], tuned[f"{coupling}.bias"])
                          for coupling, text in couplings])
    text = torch.stack([tuned[text] for _, text in couplings])
    terms = tuning.terms
    return _outputs(tuning.source_means, tuning.source_variances,
                    {layer: pair[0] for layer, pair in terms["statistics"].items()},
                    {layer: pair[1] for layer, pair in terms["statistics"].items()}, terms["alignment"],
                    tuning.last["loss"], text, vision, logits)


def _outputs(source_means, source_variances, view_means, view_variances, alignment, loss, text, vision, logits):
    return {"source_means": _slice(source_means), "source_variances": _slice(source_variances),
            "view_means": _slice(view_means), "view_variances": _slice(view_variances),
            "alignment": alignment.detach(), "loss": loss.detach(), "text_prompts": text.detach(),
            "vision_prompts": vision.detach(), "logits": logits.detach()}


def prepare_official(cfg, weights_path):
    """Stand-ins for TPT's ``dassl.utils.tpt_tools`` and ``fvcore.nn`` (imported, unused here)."""
    tools = types.ModuleType("dassl.utils.tpt_tools")
    for name in ("Summary", "ProgressMeter", "accuracy", "load_model_weight", "set_random_seed", "AverageMeter"):
        setattr(tools, name, None)
    sys.modules["dassl.utils.tpt_tools"] = tools
    fvcore = types.ModuleType("fvcore")
    fvcore.nn = types.ModuleType("fvcore.nn")
    fvcore.nn.FlopCountAnalysis = None
    sys.modules["fvcore"], sys.modules["fvcore.nn"] = fvcore, fvcore.nn


def build_official(module, cfg, classnames, clip_model):
    model = module.CustomCLIP(cfg, classnames, clip_model).float().eval()
    for name, parameter in model.named_parameters():  # as its tpt(): only the prompt learner is tuned
        parameter.requires_grad_(name.startswith("prompt_learner."))
    return model


def run_official(module, cfg, request, model, images, labels):
    source, views = images[:SOURCE_IMAGES], images[SOURCE_IMAGES:]
    blocks = model.image_encoder.transformer.resblocks
    with torch.no_grad():
        model(source)
        inputs = torch.stack([block.visual_feat.permute(1, 0, 2) for block in blocks])  # [12, S, L, D]
    means = inputs.mean(dim=1)
    variances = ((inputs - means.unsqueeze(1)) ** 2).mean(dim=1)
    trainer = module.PromptAlign.__new__(module.PromptAlign)  # only its test-time methods are used
    trainer.visual_means, trainer.visual_vars = means, variances
    recorded = {}
    entropy, align = trainer.avg_entropy, trainer.distr_align_loss

    def avg_entropy(outputs):
        value = entropy(outputs)
        recorded["entropy"] = value.detach().clone()  # test_time_tuning adds the alignment to it in place
        return value

    def distr_align_loss(out_feat, targ_feat, **kwargs):
        recorded["statistics"] = out_feat
        recorded["alignment"] = align(out_feat, targ_feat, **kwargs)
        return recorded["alignment"]

    trainer.avg_entropy, trainer.distr_align_loss = avg_entropy, distr_align_loss
    args = CN(OFFICIAL_TPT)
    model.set_prompt_inits()
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), args.LR)
    scaler = torch.cuda.amp.GradScaler(init_scale=1000, enabled=False)  # fp32 on the CPU
    with torch.no_grad():
        model.reset()
    trainer.test_time_tuning(model, views, optimizer, scaler, args)
    weight = args.DISTR_LOSS_W / (args.ALIGN_LAYER_TO - args.ALIGN_LAYER_FROM)
    alignment = weight * recorded["alignment"]
    out_means, out_variances = recorded["statistics"]
    prompts = model.prompt_learner
    with torch.no_grad():
        logits = model(views[:1])
        vision = torch.stack([prompts.proj(prompts.ctx)] + [projection(text) for projection, text in
                                                           zip(prompts.compound_prompt_projections,
                                                               prompts.compound_prompts_text)])
    out_means, out_variances = ({layer: value[layer] for layer in ALIGN_LAYERS} for value in (out_means, out_variances))
    return _outputs(means, variances, out_means, out_variances, alignment, recorded["entropy"] + alignment,
                    torch.stack([prompts.ctx, *prompts.compound_prompts_text]), vision, logits)


BENCHMARK_VIEWS, BENCHMARK_SELECTION = 64, 0.1  # the recipe's (upstream's DG config, our vit_b16.yaml)


def official_step_side(request, weights_path, inputs):
    """In the benchmark's subprocess: (one PromptAlign episode on the views, the episode's optimizer)."""
    from .common import official_dassl_model, official_episode

    views = inputs["images"]
    module, _, model = official_dassl_model(SPEC, request, weights_path, views.shape[-1])
    trainer = module.PromptAlign.__new__(module.PromptAlign)  # only its test-time methods are used
    blocks = model.image_encoder.transformer.resblocks
    tokens = model.image_encoder.positional_embedding.shape[0] + NODE["N_CTX"]
    shape = (len(blocks), tokens, model.image_encoder.positional_embedding.shape[1])
    trainer.visual_means, trainer.visual_vars = torch.zeros(shape), torch.ones(shape)
    args = CN(dict(OFFICIAL_TPT, TPT_THRESHOLD=BENCHMARK_SELECTION, ALIGN_THRESHOLD=BENCHMARK_SELECTION,
                   BATCH_SIZE=len(views)))
    model.set_prompt_inits()
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), args.LR)
    scaler = torch.cuda.amp.GradScaler(init_scale=1000, enabled=False)  # fp32 on the CPU

    return official_episode(model, trainer.test_time_tuning, views, optimizer, scaler, args), optimizer


SPEC = MethodSpec(
    name="PromptAlign",
    repository="jameelhassan/PromptAlign",
    official_module="trainers.prompt_align",
    official_cfg={"TRAINER.PROMPTALIGN": dict(NODE)},
    our_node=dict(OUR_NODE),
    learnables=maple_learnables("", DEPTH),
    batch=SOURCE_IMAGES + VIEWS,
    outputs=("source_means", "source_variances", "view_means", "view_variances", "alignment", "loss",
             "text_prompts", "vision_prompts", "logits"),
    build_ours=build_ours,
    run_ours=run_ours,
    prepare_official=prepare_official,
    build_official=build_official,
    run_official=run_official,
    mutations=(
        Mutation("other blocks aligned", node={"ALIGN_LAYERS": [0, 2]}, fails=("alignment",)),
        Mutation("deep prompts swapped", values=swap("prompt_learner.compound_prompts_text.0",
                                                     "prompt_learner.compound_prompts_text.1"),
                 fails=("view_means", "alignment", "logits"), any_fails=True),
    ),
    cost=CostSpec(step_side=official_step_side, views=BENCHMARK_VIEWS, our_nodes={}),  # our case: the recipe
)
SPECS = (SPEC,)
