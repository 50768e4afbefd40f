"""The compile contract of every trainer: its step under TRAIN.COMPILE against the eager step.

Each case the trainers declare (``trainer_cases.declared_cases``, one per registered trainer at
least, so a new trainer is covered once its class declares its case) is built through its own
class from its synthetic config (the tiny synthetic CLIP, 32 px, a few stand-in classes), in
fp32, as the mixed-precision contract builds it. ``check_case`` runs it eagerly, then compiles
its model's step methods with ``SimpleTrainer.compile_model`` (the code TRAIN.COMPILE runs) and
runs it again from the same parameters, optimizer states and random state:

* a trained case (train, cached): ``steps`` training steps (``forward_backward``) on seeded random
  images; their summaries and, after each, the gradients of the learnable parameters;
* an eval-only case, and with ``evaluate`` a trained one too: the evaluation logits [B, K] of
  seeded random images, as ``test()`` computes them.

The eager run comes first, so the runner's host-side values (the token ids' longest positions)
are known when the compiled run is traced: what is checked is the step a run repeats. Unless the
trainer declares why its step breaks (``compile_graph_breaks``), the methods are compiled with
``fullgraph=True``, so a graph break raises with dynamo's reason. A trainer that refuses
TRAIN.COMPILE (``compile_refusal``: the test-time trainers) is not run; tests/test_compile.py
checks that it refuses.
"""
import contextlib
import copy
import io
import os.path as osp
import tempfile
from types import SimpleNamespace

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from vlprompt.config import ConfigError
from vlprompt.engine.benchmark_case import EVAL_ONLY
from vlprompt.engine.compilation import STEP_METHODS
from vlprompt_app.benchmarking import mixed_precision

__all__ = ["check_case"]

BATCH = mixed_precision.BATCH


def _snapshot(trainer):
    """What a step changes, copied: the model's state (parameters and buffers, e.g. batch-norm
    statistics), the optimizers' and the schedulers' states."""
    return {
        "state": {name: value.detach().clone() for name, value in trainer.model.state_dict(keep_vars=True).items()},
        "optims": {name: copy.deepcopy(optim.state_dict())
                   for name, optim in trainer._optims.items() if optim is not None},
        "scheds": {name: copy.deepcopy(sched.state_dict())
                   for name, sched in trainer._scheds.items() if sched is not None},
    }


def _restore(trainer, snapshot):
    # Only what changed is written back: a write bumps a tensor's version counter, after which the
    # runner reads the host values of a token-id tensor again.
    state = trainer.model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, value in snapshot["state"].items():
            if not torch.equal(state[name], value):
                state[name].copy_(value)
    for name, optim_state in snapshot["optims"].items():
        trainer._optims[name].load_state_dict(copy.deepcopy(optim_state))
    for name, sched_state in snapshot["scheds"].items():
        trainer._scheds[name].load_state_dict(sched_state)
    for param in trainer.model.parameters():
        param.grad = None


def _gradients(trainer):
    return {name: param.grad.detach().clone() for name, param in trainer.model.named_parameters()
            if param.requires_grad and param.grad is not None}


def _run(case, trainer, inputs, evaluate):
    """(evaluation logits or None, [step summaries as floats], [gradients after each step]) from seed 7."""
    eval_images, batches, labels = inputs
    torch.manual_seed(7)
    logits = mixed_precision.evaluation_logits(case, trainer, eval_images) if evaluate else None
    summaries, gradients = [], []
    if case.kind != EVAL_ONLY:
        for index, images in enumerate(batches):
            summary = mixed_precision.train_step(case, trainer, index, images, labels)
            summaries.append({key: float(value) for key, value in summary.items()})
            gradients.append(_gradients(trainer))
    return logits, summaries, gradients


def _gradient_difference(eager, compiled):
    """max |compiled - eager| over the gradients of a step; inf when their names or shapes differ."""
    if set(eager) != set(compiled) or any(eager[name].shape != compiled[name].shape for name in eager):
        return float("inf")
    return max((float((compiled[name] - eager[name]).abs().max()) for name in eager if eager[name].numel()),
               default=0.0)


def _build_first_fitting(case, output_dir, backbones, opts):
    """(the case's fp32 CPU trainer, the entry of ``backbones`` it was built with): the first that builds."""
    for index, backbone in enumerate(backbones):
        try:
            return mixed_precision.build_trainer(case, "fp32", "cpu", osp.join(output_dir, str(index)),
                                                 opts=tuple(backbone) + tuple(opts)), backbone
        except ConfigError:
            if index == len(backbones) - 1:
                raise


def check_case(case, backend="eager", evaluate=False, steps=2, opts=(), backbones=((),)):
    """Run ``case`` eagerly and compiled with ``backend`` from the same state (module docstring).

    Args:
        case: a benchmark Case whose trainer does not refuse TRAIN.COMPILE.
        backend: the TRAIN.COMPILE backend ("eager", "aot_eager" or "inductor").
        evaluate: also compare the evaluation logits of a trained case (always for eval-only).
        steps: training steps compared.
        opts: more KEY VALUE config overrides (e.g. a smaller CLIP, whose graph compiles sooner).
        backbones: alternative KEY VALUE overrides (e.g. CLIPs, smallest first; () for the case's own),
            tried in order before ``opts``: the case runs with the first its trainer builds with (a
            trainer refuses a CLIP its config does not fit with a ConfigError, which the last re-raises).

    Returns:
        SimpleNamespace with ``compiled`` (the model's compiled method names), ``fullgraph``
        (compiled with fullgraph: the trainer declares no graph breaks), ``graphs`` (graphs dynamo
        compiled), ``logits_error`` (max |compiled - eager| logit, None without an evaluation),
        ``logit_scale`` (CLIP's temperature, the unit of the logits), ``losses`` ([(eager, compiled)
        summary] per step; [] for an eval-only case), ``gradient_errors`` ([max |compiled - eager|
        gradient] per step), ``gradient_scale`` (the largest |eager gradient|) and
        ``state_keys_kept`` (the registered modules' state-dict keys are those before compiling);
        ``backbone`` (the entry of ``backbones`` the case ran with).
    """
    # The code objects the cases share (CLIP's runner) start without compiled code, as in a new process.
    # Unlike torch._dynamo.reset(), this keeps the fake-tensor dispatch cache (the output shapes of the
    # ops traced, pure metadata, which a process keeps between compiles anyway): a case on a CLIP that an
    # earlier case ran traces sooner (KgCoOp after CoOp on one block per tower: 1.2 s of CPU instead of
    # 1.7 s). What is traced and checked is the same.
    torch._dynamo.reset_code_caches()
    counters.clear()
    evaluate = evaluate or case.kind == EVAL_ONLY
    with tempfile.TemporaryDirectory(prefix="compiled_") as output_dir:
        trainer, backbone = _build_first_fitting(case, osp.join(output_dir, "run"), backbones, opts)
        device = trainer.device
        inputs = (mixed_precision.random_images(BATCH, 1, device),
                  [mixed_precision.random_images(BATCH, seed, device) for seed in range(2, 2 + steps)],
                  (torch.arange(BATCH) % mixed_precision.CLASSES).to(device))
        keys = {name: list(module.state_dict()) for name, module in trainer._models.items()}
        start = _snapshot(trainer)
        eager = _run(case, trainer, inputs, evaluate)
        _restore(trainer, start)
        fullgraph = not trainer.compile_graph_breaks
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.compile_mode = trainer.compile_model(backend, fullgraph=fullgraph)
        compiled = _run(case, trainer, inputs, evaluate)
        record = SimpleNamespace(
            compiled=[name for name in STEP_METHODS if name in vars(trainer.model)], fullgraph=fullgraph,
            graphs=counters["stats"]["unique_graphs"],
            logits_error=float((compiled[0] - eager[0]).abs().max()) if evaluate else None,
            logit_scale=float(trainer.model.logit_scale.detach()),
            losses=list(zip(eager[1], compiled[1])),
            gradient_errors=[_gradient_difference(e, c) for e, c in zip(eager[2], compiled[2])],
            gradient_scale=max((float(g.abs().max()) for grads in eager[2] for g in grads.values()), default=0.0),
            state_keys_kept=keys == {name: list(module.state_dict()) for name, module in trainer._models.items()},
            backbone=backbone,
        )
    torch._dynamo.reset_code_caches()
    return record
