"""PromptAlign: distribution-aligned test-time prompt tuning (Abdul Samadh et al., NeurIPS 2023).

Source statistics (offline, once per source model): the source MaPLe model runs over the source
training set (test transform: resize, centre crop); for every block l of the image tower and every
token position p of its input x_l [L, D] (after MaPLe's prompt edits there; L = 1 + P patches + n
prompts) the mean μ̂_l[p] and the variance σ̂²_l[p] over all images are kept: two tensors
[blocks, L, D] (``tools/promptalign_stats.py``; upstream's format: one ``torch.save``'d tensor each,
``*_vis_means.pt`` / ``*_vis_vars.pt``).

Test time (per image, from the source model's prompts, reset afterwards): MaPLe+TPT's step, i.e.
64 views, the 10 % with the lowest prediction entropy kept, L_TPT = H(mean of their predictions),
plus the alignment of the kept views' token statistics with the source's,

    L_align = w · Σ_{l ∈ ALIGN_LAYERS} [0.5·mean|μ_l − μ̂_l| + 0.5·mean|σ²_l − σ̂²_l|],

μ_l, σ²_l [L, D] the per-position mean and (biased) variance over the kept views; one AdamW step
(lr 4e-2) on every prompt-learner parameter (T_k and the couplings F_k) on L_TPT + L_align, then
the prediction of the test view. Upstream's weight is DISTR_LOSS_W / (ALIGN_LAYER_TO −
ALIGN_LAYER_FROM) = 100 / 3 while its loop ``range(ALIGN_LAYER_FROM, ALIGN_LAYER_TO − 1)`` covers
layers 0 and 1 only: ALIGN_WEIGHT 100/3 and ALIGN_LAYERS [0, 1] here.

Built on TPT's episode (vlprompt/methods/prompt_tuning.py, PromptTuning "maple"):
AlignedPromptTuning only adds the alignment term to its loss, so with ALIGN_WEIGHT 0 its step is
MaPLe+TPT's. Config:
TRAINER.TPT (views, selection, steps, lr: ``PROMPT`` "maple"), TRAINER.MAPLE (the source prompts' sizes),
TRAINER.PROMPTALIGN (PREC, the alignment and where the source statistics come from).

The source statistics: upstream publishes no script (its README links precomputed ImageNet files;
its GitHub issue #5: the inference pass stores every block's input, their mean over the images is taken, then a
second pass averages the squared deviations from it). Here one pass merges per-batch means and sums of
squared deviations (Chan et al.) in float64: the same numbers. Upstream's files hold [12, L, D] tensors
(``save_feature_maps`` concatenates the blocks' [1, L, D] maps); they are read as such.

Run side by side with jameelhassan/PromptAlign @ 929056429ddbe9da449e7e55d3b16e267089a29c
(trainers/prompt_align.py: its CustomCLIP, and its own ``test_time_tuning`` with avg_entropy,
select_confident_samples and distr_align_loss) in fp32 on a seeded random ViT-B/16 with depth-3 MaPLe
prompts (T_k, F_k at 10x their init std), 3 classes and the same 12 image tensors on both sides (4 as
the source set, 8 as one test image's views, 2 kept): the source means and variances, the kept views'
statistics, the alignment term, the total loss, the text prompts after the AdamW step, the vision
prompts F_k(T_k) and the test-view logits agree (relative max differences in docs/fidelity.md;
vlprompt_app/fidelity/methods/promptalign.py, tests/test_fidelity.py).

Differences from upstream: PREC fp16 is autocast with fp32 prompts (upstream runs CLIP in fp16), the
gradient scaler is made per episode (TPT's); the selection pass scores every view without gradient and
the kept ones again with it (the same loss as upstream's single pass over all views).
"""
import dataclasses
import functools
import os.path as osp

import torch
from yacs.config import CfgNode as CN

from vlprompt.clip import CLIPRunner, MapTokens, UnsupportedBackboneError, check_prompt_sizes, load_clip, vision_prompt_plan
from vlprompt.config import (
    ConfigError, check_range, register_cfg_extension,
)
from vlprompt.data import DataManager, build_data_loader
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.benchmark_case import TEST_TIME, Case
from vlprompt.engine.run_folder import RunFolder
from vlprompt.fileio import atomic_write
from vlprompt.methods.coupled_prompts import MaPLeCLIP
from vlprompt.methods.prompt_tuning import PromptTuning, PromptTuningTrainer

STATISTICS_DIRNAME = "promptalign_stats"  # in the source run folder
MEANS_FILENAME = "vis_means.pt"
VARIANCES_FILENAME = "vis_vars.pt"


@register_cfg_extension
def add_promptalign_config(cfg):
    node = cfg.TRAINER.PROMPTALIGN = CN()
    node.PREC = "fp16"  # this trainer's precision (TRAINER.TPT.PREC is the TPT trainer's)
    node.ALIGN_LAYERS = [0, 1]  # blocks whose input statistics are aligned (upstream: range(FROM, TO - 1))
    node.ALIGN_WEIGHT = 100.0 / 3  # upstream: DISTR_LOSS_W 100 / (ALIGN_LAYER_TO 3 - ALIGN_LAYER_FROM 0)
    node.VIS_MEANS = ""  # source token means [blocks, L, D]; "" = --model-dir's promptalign_stats/vis_means.pt
    node.VIS_VARS = ""  # source token variances; "" = --model-dir's promptalign_stats/vis_vars.pt
    node.COMPUTE_STATS = False  # missing default files: compute them from --model-dir's run (else an error)
    node.STATS_SHOTS = 0  # training images per class of that computation (0 = all, as upstream)


def recording_plan(plan, layers):
    """``plan`` plus a recorder at the input of each block in ``layers``.

    Args:
        plan: a vision Plan (e.g. MaPLe's ``vision_prompt_plan``).
        layers: 0-based block indices.

    Returns:
        (plan', inputs): running plan' fills ``inputs[l]`` with the input [B, L, D] of block l,
        after the plan's own edits there (upstream's ``resblock.visual_feat``).
    """
    inputs = {}
    edits = dict(plan.layers)
    for layer in layers:
        edits[layer] = (*plan.edits_at(layer), MapTokens(functools.partial(_keep, inputs, layer)))
    return dataclasses.replace(plan, layers=edits), inputs


def _keep(inputs, layer, x):
    inputs[layer] = x
    return x


def token_statistics(tokens):
    """Per-position mean and biased variance over views: tokens [V, L, D] -> ([L, D], [L, D])."""
    mean = tokens.mean(dim=0)
    return mean, (tokens - mean).pow(2).mean(dim=0)


def alignment_loss(statistics, source_means, source_variances):
    """Σ_l 0.5·mean|μ_l − μ̂_l| + 0.5·mean|σ²_l − σ̂²_l| (a scalar, unweighted).

    Args:
        statistics: {block l: (μ_l [L, D], σ²_l [L, D])} of the test views.
        source_means, source_variances: [blocks, L, D] source statistics.
    """
    loss = 0.0
    for layer, (mean, variance) in statistics.items():
        loss = loss + 0.5 * (mean - source_means[layer]).abs().mean() \
            + 0.5 * (variance - source_variances[layer]).abs().mean()
    return loss


class TokenStatistics:
    """Running per-block, per-position mean and variance over images (Chan's merge, float64).

    ``add(inputs)`` takes {block l: [B, L, D]}; ``result()`` gives (means, variances)
    [blocks, L, D] float32, blocks in increasing order.
    """

    def __init__(self):
        self.count, self.means, self.squares = 0, {}, {}

    def add(self, inputs):
        batch = next(iter(inputs.values())).shape[0]
        total = self.count + batch
        for layer, tokens in inputs.items():
            tokens = tokens.detach().double()
            mean, squares = tokens.mean(dim=0), (tokens - tokens.mean(dim=0)).pow(2).sum(dim=0)
            if self.count == 0:
                self.means[layer], self.squares[layer] = mean, squares
                continue
            delta = mean - self.means[layer]
            self.means[layer] = self.means[layer] + delta * (batch / total)
            self.squares[layer] = self.squares[layer] + squares + delta.pow(2) * (self.count * batch / total)
        self.count = total

    def result(self):
        if self.count == 0:
            raise ValueError("No images were added to the token statistics.")
        layers = sorted(self.means)
        means = torch.stack([self.means[layer] for layer in layers]).float()
        variances = torch.stack([self.squares[layer] / self.count for layer in layers]).float()
        return means, variances


def image_features_and_block_inputs(model, images, layers):
    """A MaPLe model's image features with the inputs of some blocks of its image tower.

    Args:
        model: MaPLeCLIP (or a subclass). images: [B, 3, H, W]. layers: block indices.

    Returns:
        (features [B, E] unnormalised, {block l: [B, L, D]}).
    """
    plan, inputs = recording_plan(vision_prompt_plan(model.prompt_learner.vision_prompts()), layers)
    return model.clip.encode_image(images, plan), inputs


def source_statistics(model, loader, device, autocast):
    """Source statistics of every block input of ``model``'s image tower over ``loader``'s images.

    Args:
        model: the source MaPLeCLIP. loader: yields {"img": [B, 3, H, W]}.
        device: where the model is. autocast: the trainer's autocast context factory.

    Returns:
        (means, variances) float32 [blocks, L, D].
    """
    statistics = TokenStatistics()
    layers = range(model.clip.visual.num_layers)
    with torch.no_grad():
        for batch in loader:
            with autocast():
                _, inputs = image_features_and_block_inputs(model, batch["img"].to(device), layers)
            statistics.add(inputs)
    return statistics.result()


def read_run_config(model_dir):
    """The merged config of the training run in ``model_dir`` (:meth:`RunFolder.read_config`);
    ConfigError without one, since the source training set is then unknown."""
    return RunFolder(model_dir).read_config()


def source_cfg(run_cfg, num_shots, root=None):
    """The source run's config reading ``num_shots`` training images per class (0 = all, as
    upstream) from ``root`` (default: the run's DATASET.ROOT)."""
    cfg = run_cfg.clone()
    cfg.defrost()
    cfg.DATASET.NUM_SHOTS = num_shots
    if root:
        cfg.DATASET.ROOT = root
    cfg.freeze()
    return cfg


def training_images_loader(cfg, manager, batch_size):
    """The training images of ``manager`` (a DataManager of ``cfg``) in order, with the test
    transform (resize, centre crop), as upstream's inference pass."""
    print(f"PromptAlign source statistics over {len(manager.dataset.train_x):,} training images of {cfg.DATASET.NAME}")
    return build_data_loader(cfg, "SequentialSampler", manager.dataset.train_x, batch_size=batch_size,
                             tfm=manager.test_loader.dataset.transform, is_train=False)


def write_source_statistics(means, variances, means_path, variances_path):
    """Save the statistics in upstream's format (one tensor [blocks, L, D] per file), atomically."""
    for value, path in ((means, means_path), (variances, variances_path)):
        with atomic_write(path, "wb") as f:
            torch.save(value, f)
    print(f"PromptAlign source statistics [blocks, L, D] = {tuple(means.shape)}: {means_path}, {variances_path}")


def statistics_paths(model_dir):
    """The default statistics files of a source run folder: (means, variances) paths."""
    folder = osp.join(model_dir, STATISTICS_DIRNAME)
    return osp.join(folder, MEANS_FILENAME), osp.join(folder, VARIANCES_FILENAME)


def stats_command(model_dir):
    """The command that writes the default statistics files of the source run ``model_dir``."""
    return f"python tools/promptalign_stats.py --model-dir {model_dir or '<the source MaPLe run folder>'}"


def load_source_statistics(means_path, variances_path, shape, layers, command):
    """Read the source statistics files (upstream's format) and check them.

    Args:
        means_path, variances_path: ``torch.save``'d tensors [blocks, L, D].
        shape: the (L, D) of the model's block inputs.
        layers: the blocks the loss aligns (each must be present).
        command: how to make the files (named in errors).

    Returns:
        (means, variances) float32 [blocks, L, D].
    """
    tensors = []
    for path, what in ((means_path, "means"), (variances_path, "variances")):
        if not osp.isfile(path):
            raise ConfigError(f'PromptAlign\'s source token {what} "{path}" do not exist: compute them with the '
                              f"source model over its training set: {command}")
        value = torch.load(path, map_location="cpu", weights_only=True)
        if not torch.is_tensor(value) or value.dim() != 3 or tuple(value.shape[1:]) != tuple(shape) \
                or value.shape[0] <= max(layers):
            found = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ConfigError(
                f'PromptAlign\'s source token {what} "{path}" must be a tensor [blocks > {max(layers)}, '
                f"{shape[0]}, {shape[1]}] (the block inputs of this model's image tower with its prompts), got "
                f"{found}: they were made for another model. Recompute them: {command}"
            )
        tensors.append(value.float())
    return tuple(tensors)


class PromptAlignCLIP(MaPLeCLIP):
    """MaPLe's model that keeps the inputs of some image-tower blocks of its last image forward.

    Args:
        clip, tokenizer, classnames, node: as MaPLeCLIP (node: TRAINER.MAPLE).
        align_layers: the blocks whose inputs are kept.

    Attributes:
        block_inputs: {block l: [B, L, D]} of the last ``unnormalised_image_features`` call
            (L = 1 + P + n: class token, patches, the vision prompts).
    """

    def __init__(self, clip, tokenizer, classnames, node, align_layers):
        super().__init__(clip, tokenizer, classnames, node)
        self.align_layers = list(align_layers)
        self.block_inputs = {}

    def unnormalised_image_features(self, images):
        features, self.block_inputs = image_features_and_block_inputs(self, images, self.align_layers)
        return features


class AlignedPromptTuning(PromptTuning):
    """MaPLe+TPT's episode (PromptTuning "maple") whose objective adds the distribution alignment.

    Args:
        model: PromptAlignCLIP. node: the episode keys (TRAINER.TPT). align: ALIGN_WEIGHT (TRAINER.PROMPTALIGN).
        autocast, grad_scaling: as PromptTuning.

    Attributes:
        source_means, source_variances: [blocks, L, D], set before the episodes.
        terms: of the last episode's first step, "entropy", "alignment" (weighted) and "statistics"
            {l: (μ_l, σ²_l) [L, D]} of the kept views.
    """

    def __init__(self, model, node, align, autocast, grad_scaling=False):
        super().__init__(model, "maple", node, autocast, grad_scaling)
        self.weight = align.ALIGN_WEIGHT
        self.source_means = self.source_variances = None
        self.terms = {}

    def episode_loss(self, logits):
        """H(mean prediction) of the kept views' logits [V', K] + w·alignment of their block-input statistics."""
        entropy = super().episode_loss(logits)
        statistics = {layer: token_statistics(tokens.float()) for layer, tokens in self.model.block_inputs.items()}
        alignment = self.weight * alignment_loss(statistics, self.source_means, self.source_variances)
        if not self.terms:
            self.terms = {"entropy": entropy.detach(), "alignment": alignment.detach(),
                          "statistics": {layer: tuple(value.detach() for value in pair)
                                         for layer, pair in statistics.items()}}
        return entropy + alignment

    def maple_episode(self, views):
        self.terms = {}
        return super().maple_episode(views)


def stand_in_statistics_options(settings, output_dir):
    """The cost benchmark's source statistics (its case's ``prepare``): zero means and unit variances (the
    step's cost does not depend on their values) of the benchmark's backbone with MaPLe's 2 prompt tokens
    (PromptAlign/vit_b16.yaml); returns its VIS_MEANS / VIS_VARS overrides."""
    clip_model, _ = load_clip(settings["backbone"], settings["weights"], device="cpu")
    visual = CLIPRunner(clip_model).visual
    if visual is None:
        raise UnsupportedBackboneError(f"PromptAlign's statistics are of prompted image-tower blocks; the image "
                                       f"tower of {settings['backbone']} is not one the prompted runner drives.")
    shape = (visual.num_layers, visual.layout.length + 2, visual.width)
    paths = osp.join(output_dir, "promptalign_means.pt"), osp.join(output_dir, "promptalign_vars.pt")
    write_source_statistics(torch.zeros(shape), torch.ones(shape), *paths)
    return ("TRAINER.PROMPTALIGN.VIS_MEANS", paths[0], "TRAINER.PROMPTALIGN.VIS_VARS", paths[1])


@TRAINER_REGISTRY.register()
class PromptAlign(PromptTuningTrainer):
    """PromptAlign: TPT on a MaPLe run (TRAINER.TPT.PROMPT "maple", ``--model-dir``) plus the alignment.

    The model is registered as MaPLe's ("MultiModalPromptLearner"), so a MaPLe run's checkpoint loads;
    every prompt-learner parameter (T_k, F_k) is tuned and reset per image.
    """

    # MaPLe+TPT's episode plus the alignment, on stand-in source statistics.
    benchmark_cases = (
        Case("PromptAlign/vit_b16.yaml", TEST_TIME, batch=1, eval_target=None, prepare=stand_in_statistics_options),
    )

    # Why tools/export.py refuses this method (vlprompt_app.export reads it).
    export_refusal = ("every prediction reads the source run's token statistics (its promptalign_stats/ folder, "
                      "or TRAINER.PROMPTALIGN.VIS_MEANS / VIS_VARS), which an exported file does not hold; "
                      "predict from the source run: tools/predict.py SOURCE_RUN ... --test-time PromptAlign")

    def check_cfg(self, cfg):
        node = cfg.TRAINER.PROMPTALIGN
        if cfg.TRAINER.TPT.PROMPT != "maple":
            raise ConfigError(f'PromptAlign tunes MaPLe\'s prompts: TRAINER.TPT.PROMPT must be "maple", '
                              f"got {cfg.TRAINER.TPT.PROMPT!r} (configs/trainers/PromptAlign/ set it).")
        check_prompt_sizes(cfg, "MAPLE", text=("PROMPT_DEPTH", "N_CTX"), vision=("PROMPT_DEPTH", "N_CTX"))
        if not node.ALIGN_LAYERS or min(node.ALIGN_LAYERS) < 0:
            raise ConfigError(f"TRAINER.PROMPTALIGN.ALIGN_LAYERS must list block indices >= 0, got {node.ALIGN_LAYERS}.")
        check_range("TRAINER.PROMPTALIGN.ALIGN_WEIGHT", node.ALIGN_WEIGHT, minimum=0)
        check_range("TRAINER.PROMPTALIGN.STATS_SHOTS", node.STATS_SHOTS, minimum=0)
        if bool(node.VIS_MEANS) != bool(node.VIS_VARS):
            raise ConfigError("TRAINER.PROMPTALIGN.VIS_MEANS and VIS_VARS are given together (two files of one "
                              f"statistics computation), got {node.VIS_MEANS!r} and {node.VIS_VARS!r}.")
        super().check_cfg(cfg)

    def build_model(self):
        cfg, node = self.cfg, self.cfg.TRAINER.PROMPTALIGN
        clip, tokenizer = self.build_clip()
        blocks = clip.visual.num_layers
        if max(node.ALIGN_LAYERS) >= blocks:
            raise ConfigError(f"TRAINER.PROMPTALIGN.ALIGN_LAYERS {list(node.ALIGN_LAYERS)}: the image tower of "
                              f"{cfg.MODEL.BACKBONE.NAME} has blocks 0..{blocks - 1}.")
        self.model = PromptAlignCLIP(clip, tokenizer, self.classnames, cfg.TRAINER.MAPLE, node.ALIGN_LAYERS)
        self.model.to(self.device).eval().requires_grad_(False)
        self.register_model("MultiModalPromptLearner", self.model)
        self.tuning = AlignedPromptTuning(self.model, cfg.TRAINER.TPT, node, self.autocast,
                                          grad_scaling=self.amp.scaler is not None)
        self.source_dir = None

    def load_model(self, directory, epoch=None):
        super().load_model(directory, epoch)
        self.source_dir = directory or None

    def start_episodes(self):
        """Every episode starts from the loaded prompts; the source statistics are read (or computed)."""
        super().start_episodes()
        means, variances = self.read_source_statistics()
        self.tuning.source_means, self.tuning.source_variances = means.to(self.device), variances.to(self.device)

    def read_source_statistics(self):
        """(means, variances) [blocks, L, D] from VIS_MEANS / VIS_VARS, or --model-dir's default files
        (computed first with COMPUTE_STATS when missing)."""
        node, visual = self.cfg.TRAINER.PROMPTALIGN, self.model.clip.visual
        shape = (visual.layout.length + self.cfg.TRAINER.MAPLE.N_CTX, visual.width)
        command = stats_command(self.source_dir)
        if node.VIS_MEANS:
            return load_source_statistics(node.VIS_MEANS, node.VIS_VARS, shape, node.ALIGN_LAYERS, command)
        if self.source_dir is None:
            raise ConfigError("PromptAlign needs the source statistics of the model it starts from: give the source "
                              "MaPLe run with --model-dir (its promptalign_stats/ folder, made by "
                              f"{stats_command(None)}) or the files as TRAINER.PROMPTALIGN.VIS_MEANS / VIS_VARS.")
        paths = statistics_paths(self.source_dir)
        if node.COMPUTE_STATS and not all(osp.isfile(path) for path in paths):
            run_cfg = source_cfg(read_run_config(self.source_dir), node.STATS_SHOTS, self.cfg.DATASET.ROOT)
            loader = training_images_loader(run_cfg, DataManager(run_cfg), run_cfg.DATALOADER.TEST.BATCH_SIZE)
            write_source_statistics(*source_statistics(self.model, loader, self.device, self.autocast), *paths)
        return load_source_statistics(*paths, shape, node.ALIGN_LAYERS, command)
