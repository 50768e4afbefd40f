"""The mixed-precision contract of every trainer: two training steps, an evaluation and a resume
under autocast, measured against the same trainer in fp32.

Each case the trainers declare (``trainer_cases.declared_cases``: one per registered trainer at
least, so a new trainer is covered once its class declares its case) is built through its own class from its synthetic-benchmark config
(``Case.synthetic_config``: the tiny synthetic CLIP, 32 px), with a few stand-in classes instead
of a dataset, at ``TRAINER.<NAME>.PREC`` fp16 (autocast with a GradScaler) or bf16 (autocast, no
scaler); on the CPU ``TRAIN.CPU_AUTOCAST`` turns autocast on. ``check_case`` then measures, on
seeded random images:

* evaluation: the logits [B, K] under the trainer's autocast, the fp32 logits of the same
  weights before and after them (a cache that kept a half-precision result changes the second);
  a test-time trainer's logits are those of one adaptation episode per image (at ``EPISODE_LR``);
* training (not for eval-only and test-time cases): two ``forward_backward`` calls; the losses,
  the gradients of the learnable parameters, which parameters changed and whether the scaler
  skipped a step. The scaler starts at ``INITIAL_SCALE`` instead of GradScaler's 2^16: at 2^16
  the cross-entropy gradient, multiplied by CLIP's temperature (100), overflows fp16 in the first
  steps, which the scaler skips as designed (halving its scale each time), so two steps from
  2^16 would often change nothing (CoCoOp, KgCoOp, TCP, MMRL and DeAR skipped both; MMA still
  skipped both from 2^10, none from 2^6);
* device placement (optional): the evaluation and the two steps run under
  :class:`~vlprompt_app.benchmarking.device_placement.DevicelessTensorCheck`;
* resuming (optional): the checkpoint written after the two steps is loaded by a second trainer;
  both take a third step on the same batch, which must leave them with the same weights,
  optimizer states and scaler state.

The tests assert on the record (tests/test_mixed_precision.py on the CPU); a GPU script calls
``check_case`` with ``device="cuda"`` for the same record.
"""
import contextlib
import io
import os.path as osp
import tempfile
import warnings
from types import SimpleNamespace

import torch

from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.amp import MixedPrecision, precision_key
from vlprompt.paths import repository_root
from vlprompt_app.benchmarking.device_placement import DevicelessTensorCheck
from vlprompt.engine.benchmark_case import CACHED, EVAL_ONLY, TEST_TIME
from vlprompt_app.benchmarking.trainer_cases import (
    SYNTHETIC_CLIP, SYNTHETIC_IMAGE_SIZE, SYNTHETIC_WEIGHTS, SyntheticClasses, training_batch,
)

ROOT = str(repository_root())
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CLASSES = 5
BATCH = 2
IMAGE_SIZE = SYNTHETIC_IMAGE_SIZE
INITIAL_SCALE = 2.0 ** 6
# The first AdamW step of an episode moves every tuned value by about +-LR whatever the size of its
# gradient, so a value whose near-zero gradient changes sign under rounding moves the other way:
# the adapted logits then differ from fp32's by an amount that grows with LR, not with the
# precision (MaPLe+TPT, in units of tau: fp16 0.0002 at LR 1e-7, 0.023 at 5e-3, 0.086 at its
# synthetic 0.04). Episodes run at this LR, so their logits measure the precision of the adapted
# forward and backward passes.
EPISODE_LR = 1e-6


def contract_cases(cases):
    """The cases the contract runs: one per distinct (trainer, synthetic config and its options, kind)."""
    seen, chosen = set(), []
    for case in cases:
        key = (case.trainer, case.synthetic_config, case.synthetic_opts, case.kind)
        if key not in seen:
            seen.add(key)
            chosen.append(case)
    return chosen


def build_cfg(case, prec, device, output_dir, backbone=(SYNTHETIC_CLIP, SYNTHETIC_WEIGHTS), opts=()):
    """The case's synthetic config at precision ``prec`` on ``device`` ("cpu" autocasts through
    TRAIN.CPU_AUTOCAST), with the case's overrides and those of ``case.prepare``; ``backbone``
    (model config, weights) replaces the synthetic CLIP, ``opts`` (KEY VALUE) come last."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, osp.join(ROOT, "configs", "trainers", case.synthetic_config))
    cfg.TRAINER.NAME = case.trainer
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = backbone
    cfg.INPUT.SIZE = (IMAGE_SIZE, IMAGE_SIZE)
    cfg.USE_CUDA = device == "cuda"
    cfg.TRAIN.CPU_AUTOCAST = True
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = case.batch or BATCH
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.FEATURE_CACHE.ENABLED = case.kind == CACHED
    cfg.FEATURE_CACHE.DIR = osp.join(output_dir, "feature_cache")
    cfg.OUTPUT_DIR = output_dir
    if precision_key(cfg) is not None:
        cfg.TRAINER[case.trainer.upper()].PREC = prec
    if case.kind == TEST_TIME:
        cfg.TRAINER[TRAINER_REGISTRY.get(case.trainer).episode_node].LR = EPISODE_LR
    settings = {"backbone": backbone[0], "weights": backbone[1], "image_size": IMAGE_SIZE}
    with contextlib.redirect_stdout(io.StringIO()):
        prepared = case.prepare(settings, output_dir) if case.prepare is not None else ()
    merge_from_list(cfg, list(case.opts) + list(case.synthetic_opts) + list(prepared) + list(opts))
    cfg.freeze()
    return cfg


def build_trainer(case, prec, device, output_dir, opts=()):
    """The case's trainer class on ``CLASSES`` stand-in classes, built from ``build_cfg`` (``opts``:
    more KEY VALUE overrides)."""
    trainer_class = TRAINER_REGISTRY.get(case.trainer)
    contract_class = type(f"MixedPrecision{case.trainer}", (SyntheticClasses, trainer_class),
                          {"benchmark_classes": CLASSES})
    torch.manual_seed(0)  # before case.prepare too: PromptKD's stand-in teacher is drawn at random
    cfg = build_cfg(case, prec, device, output_dir, opts=opts)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = contract_class(cfg)
        if case.after_build is not None:
            case.after_build(trainer)
    return trainer


@contextlib.contextmanager
def precision(trainer, amp):
    """Run ``trainer`` at ``amp`` (a MixedPrecision) inside the block."""
    kept, trainer.amp = trainer.amp, amp
    try:
        yield
    finally:
        trainer.amp = kept


@contextlib.contextmanager
def autocast_without_precision_key(trainer, dtype):
    """A trainer without TRAINER.<NAME>.PREC (zero-shot CLIP) always runs in fp32: the contract
    autocasts its evaluation itself, as a caller's autocast would."""
    if precision_key(trainer.cfg) is not None:
        yield
        return
    with torch.autocast(trainer.device.type, dtype=dtype):
        yield


def evaluation_logits(case, trainer, images):
    """Logits [B, K] of ``images`` [B, 3, H, W] as ``test()`` computes them (eval mode, one
    evaluation context); a test-time trainer adapts one episode per image on its views
    ``images`` [B, V, 3, H, W]."""
    trainer.set_model_mode("eval")
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        if case.kind == TEST_TIME:
            trainer.start_episodes()
            return trainer.model_inference(images).float()
        with trainer.model.evaluation():
            inputs = training_batch(case, trainer, images, None)["features"] if case.kind == CACHED else images
            return trainer.model_inference(inputs).float()


def random_images(count, seed, device):
    """Seeded N(0, 1) images [count, 3, IMAGE_SIZE, IMAGE_SIZE] on ``device``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator).to(device)


def start_scale(scaler, device):
    """Set a GradScaler that has not stepped yet to ``INITIAL_SCALE``."""
    scaler.scale(torch.zeros((), device=device))  # creates the scale tensor
    scaler.update(INITIAL_SCALE)


def train_step(case, trainer, batch_index, images, labels):
    """One ``forward_backward`` in training mode (not the epoch's last batch); returns its summary."""
    trainer.set_model_mode("train")
    trainer.batch_idx, trainer.num_batches = batch_index, 1000
    with contextlib.redirect_stdout(io.StringIO()):
        return trainer.forward_backward(training_batch(case, trainer, images, labels))


def trainer_state(trainer):
    """{"weights": {name: tensor}, "optimizers": {name: state dict}, "scaler": state or None} of
    every registered model, copied."""
    weights = {f"{name}.{key}": value.detach().clone()
               for name in trainer.get_model_names() for key, value in trainer._models[name].state_dict().items()}
    optimizers = {name: _copy(trainer._optims[name].state_dict())
                  for name in trainer.get_model_names() if trainer._optims[name] is not None}
    return {"weights": weights, "optimizers": optimizers, "scaler": _copy(trainer.amp.state_dict())}


def _copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(item) for item in value)
    return value


def state_differences(first, second):
    """Names of the entries of two ``trainer_state`` results that are not exactly equal."""
    differences = []

    def compare(name, a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                    and a.shape == b.shape and torch.equal(a, b)):
                differences.append(name)
        elif isinstance(a, dict) and isinstance(b, dict):
            if set(a) != set(b):
                differences.append(name)
            for key in set(a) & set(b):
                compare(f"{name}.{key}", a[key], b[key])
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
            for index, (x, y) in enumerate(zip(a, b)):
                compare(f"{name}[{index}]", x, y)
        elif a != b:
            differences.append(name)

    compare("state", first, second)
    return differences


def check_case(case, prec, device="cpu", resume=True, placement=True, opts=()):
    """Run the contract of ``case`` at ``prec`` ("fp16" or "bf16") on ``device``; ``resume`` and
    ``placement`` choose whether the resume and the device-placement checks run; ``opts``: more KEY
    VALUE overrides of the trainers built (e.g. a smaller CLIP).

    Returns:
        SimpleNamespace with
        ``has_precision`` (the trainer has TRAINER.<NAME>.PREC; without it the contract autocasts
        the evaluation itself); ``dtype``, ``scaler`` (the trainer's autocast dtype; whether it
        scales gradients);
        ``logit_scale`` (CLIP's temperature, the unit of the logit errors);
        ``logits_error`` (max |autocast logit - fp32 logit|), ``logits_finite``,
        ``fp32_repeatable`` (the fp32 logits after the autocast evaluation equal those before);
        for trained cases (None otherwise): ``losses`` (the two steps' summaries),
        ``learnable`` / ``changed`` / ``frozen_changed`` (parameter names: with requires_grad;
        changed by the steps; changed without requires_grad), ``grads_finite`` ({name: bool} of the
        learnable parameters with a gradient after the second step), ``grad_dtypes`` (their dtypes),
        ``skipped_steps`` (steps the scaler skipped), ``resume_differences`` (with ``resume``: what
        differs after the third step between the trainer and the one resumed from its checkpoint);
        ``deviceless``, ``device_draws`` (with ``placement``: the ``Fault``s and device-generator
        draws that DevicelessTensorCheck recorded in the evaluation and the steps);
        ``amp_warnings`` (warnings that name GradScaler or autocast, e.g. a GradScaler made for
        another device).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = _check_case(case, prec, device, resume, placement, opts)
    record.amp_warnings = sorted({str(warning.message) for warning in caught
                                  if any(word in str(warning.message) for word in ("GradScaler", "autocast"))})
    return record


def _check_case(case, prec, device, resume, placement, opts):
    dtype = AUTOCAST_DTYPES[prec]
    with tempfile.TemporaryDirectory(prefix="mixed_precision_") as output_dir:
        trainer = build_trainer(case, prec, device, osp.join(output_dir, "run"), opts=opts)
        fp32 = MixedPrecision("fp32", trainer.device)
        if case.kind == TEST_TIME:  # one image of NUM_VIEWS distinct random views
            views = trainer.episode_cfg.NUM_VIEWS
            images = random_images(views, 1, trainer.device).view(1, views, 3, IMAGE_SIZE, IMAGE_SIZE)
        else:
            images = random_images(BATCH, 1, trainer.device)
        with precision(trainer, fp32):
            reference = evaluation_logits(case, trainer, images)
        check = DevicelessTensorCheck(ROOT) if placement else None
        with autocast_without_precision_key(trainer, dtype), check or contextlib.nullcontext():
            logits = evaluation_logits(case, trainer, images)
        with precision(trainer, fp32):
            repeated = evaluation_logits(case, trainer, images)
        record = SimpleNamespace(
            has_precision=precision_key(trainer.cfg) is not None, dtype=trainer.amp.dtype,
            scaler=trainer.amp.scaler is not None,
            logit_scale=float(trainer.model.logit_scale.detach()),
            logits_error=(logits - reference).abs().max().item(), logits_finite=bool(torch.isfinite(logits).all()),
            fp32_repeatable=torch.equal(reference, repeated),
            losses=None, learnable=None, changed=None, frozen_changed=None, grads_finite=None, grad_dtypes=None,
            skipped_steps=None, resume_differences=None, deviceless=check and check.faults,
            device_draws=check and check.device_draws,
        )
        if case.kind not in (EVAL_ONLY, TEST_TIME):
            train_checks(case, prec, device, trainer, record, check, resume, output_dir, opts)
        return record


def train_checks(case, prec, device, trainer, record, check, resume, output_dir, opts):
    """The training and resuming fields of ``record`` (see ``check_case``)."""
    model = trainer.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    labels = (torch.arange(BATCH) % CLASSES).to(trainer.device)
    batches = [random_images(BATCH, seed, trainer.device) for seed in (2, 3, 4)]
    record.losses, record.skipped_steps = [], 0
    if record.scaler:
        start_scale(trainer.amp.scaler, trainer.device)
    for index, images in enumerate(batches[:2]):
        scale = trainer.amp.scaler.get_scale() if record.scaler else None
        with check or contextlib.nullcontext():
            record.losses.append(train_step(case, trainer, index, images, labels))
        if record.scaler and trainer.amp.scaler.get_scale() < scale:
            record.skipped_steps += 1
    params = dict(model.named_parameters())
    record.learnable = sorted(name for name, p in params.items() if p.requires_grad)
    record.changed = sorted(name for name, p in params.items() if not torch.equal(p.detach(), before[name]))
    record.frozen_changed = sorted(set(record.changed) - set(record.learnable))
    with_grad = {name: params[name].grad for name in record.learnable if params[name].grad is not None}
    record.grads_finite = {name: bool(torch.isfinite(grad).all()) for name, grad in with_grad.items()}
    record.grad_dtypes = {name: grad.dtype for name, grad in with_grad.items()}

    if not resume:
        return
    checkpoints = osp.join(output_dir, "checkpoints")
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.save_model(0, checkpoints)
    resumed = build_trainer(case, prec, device, osp.join(output_dir, "resumed"), opts=opts)
    with contextlib.redirect_stdout(io.StringIO()):
        resumed.resume_model_if_exist(checkpoints)
    for each in (trainer, resumed):
        torch.manual_seed(5)  # the same RNG for the third step's dropout or sampling, if any
        train_step(case, each, 2, batches[2], labels)
    record.resume_differences = state_differences(trainer_state(trainer), trainer_state(resumed))

