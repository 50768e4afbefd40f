"""Steps several methods share, on either side of the comparison."""
import copy
import sys
import types

import torch
import torch.nn.functional as F


def logits_and_ce(model, images, labels):
    """``model(images)`` in eval: {"logits": [B, C], "loss": the batch's cross-entropy}."""
    with torch.no_grad():
        logits = model(images)
    return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


def run_ours_logits_and_ce(model, node, images, labels):
    return logits_and_ce(model, images, labels)


def run_official_logits_and_ce(module, cfg, request, model, images, labels):
    return logits_and_ce(model, images, labels)


def reversed_rows(learnables):
    """A ``Mutation.values``: every learnable value with its rows in reverse order (e.g. ctx tokens)."""
    return {name: value.flip(0) for name, value in learnables.items()}


def stand_in_datasets(classnames):
    """``src.datasets`` (and ``src.datasets.common``) of wise-ft / FLYP holding one dataset class,
    ``FixtureClasses``, with ``classnames``: what ``get_zeroshot_classifier`` reads (the real package
    imports every dataset and the evaluation helpers, which need the data sets)."""

    class FixtureClasses:
        def __init__(self, preprocess, location=None, batch_size=None, **kwargs):
            self.classnames = list(classnames)

    datasets = types.ModuleType("src.datasets")
    datasets.FixtureClasses = FixtureClasses
    common = types.ModuleType("src.datasets.common")
    common.get_dataloader = common.maybe_dictionarize = None
    sys.modules["src.datasets"], sys.modules["src.datasets.common"] = datasets, common


def official_dassl_model(spec, request, weights_path, resolution):
    """In the official subprocess: the official model of ``spec`` built as the equivalence builds it
    (``official_setup``, the official ``load_clip_to_cpu`` in fp32, the spec's ``build_official``),
    for a step hook (``CostSpec.step_side``) of Dassl-based code.

    Returns:
        (official module, Dassl config, model).
    """
    from ..official_env import official_setup

    cfg, module, _ = official_setup(spec, request["backbone"], resolution, weights_path)
    clip_model = module.load_clip_to_cpu(cfg).float()
    return module, cfg, spec.build_official(module, cfg, request["classnames"], clip_model)


def official_episode(model, test_time_tuning, views, optimizer, scaler, args):
    """The body of upstream TPT's per-image loop (shared by PromptAlign's) as a zero-argument step:
    reset the prompts, reload the optimizer's initial state, ``test_time_tuning(model, views,
    optimizer, scaler, args)`` (its steps on the kept views), then the prediction of the test view
    ``views[:1]``."""
    initial_state = copy.deepcopy(optimizer.state_dict())

    def episode():
        with torch.no_grad():
            model.reset()
        optimizer.load_state_dict(initial_state)
        test_time_tuning(model, views, optimizer, scaler, args)
        with torch.no_grad():
            model(views[:1])

    return episode
