"""Skip Tuning: the upper blocks of both towers fine-tuned on per-epoch caches of block-S states,
class-wise skip with a rank-based keep mask drawn once per run, same-class batches, the
per-dataset epoch count, checkpoints of the tuned blocks only and exact resuming
(trainers/skip_tuning.py), checked against hand computations with open_clip's own blocks."""
import math
import os

import pytest
import torch
import torch.nn.functional as F
from baseline_setup import (  # noqa: F401
    build_seeded, frozen, learnable, runner_and_tokenizer, toy_pets_cfg, toy_world,
)

from trainers.skip_tuning import (
    TEMPLATES, SkipTuningCLIP, batch_plan, draw_keep_mask, keep_probabilities, num_top_classes,
    select_classes,
)
from vlprompt.clip import Tokenizer
from vlprompt.config import ConfigError
from vlprompt_app.protocols.grid import Method, merged_max_epoch
from vlprompt.utils import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSNAMES = ["abyssinian", "american bulldog", "bengal", "birman"]
TEMPLATE = "a photo of a {}, a type of pet."
START = 1  # the tiny CLIP: 3 image and 2 text blocks
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def runner(toy_world):  # noqa: F811
    _, config, weights = toy_world
    return runner_and_tokenizer((config, weights))


def build_model(toy_world, perturb=True):  # noqa: F811
    """The model on a fresh tiny CLIP; with ``perturb`` the tuned weights move away from the
    pretrained ones (so a frozen path used instead of the tuned one shows)."""
    _, config, weights = toy_world
    clip, tokenizer = runner_and_tokenizer((config, weights))
    model = SkipTuningCLIP(clip, tokenizer, CLASSNAMES, TEMPLATE, START)
    if perturb:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.text_parameters() + model.image_parameters():
                param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model


def images(n=4, seed=3):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ class-wise skip
@pytest.mark.parametrize("classes, ratio, max_top, expected", [
    (500, 0.5, 50, 50), (40, 0.5, 50, 20), (5, 0.5, 50, 3), (10, 3.0, 50, 3), (10, 30.0, 50, 10), (2, 0.5, 50, 1),
])
def test_number_of_top_classes(classes, ratio, max_top, expected):
    assert num_top_classes(classes, ratio, max_top) == expected


def test_keep_probabilities_are_one_then_the_normalised_exponential_pdf():
    probabilities = keep_probabilities(10, 4, 0.3)
    xs = [5.0 * i / 5 for i in range(6)]  # linspace(0, 5, 6)
    pdf = [math.exp(-x / 0.3) / 0.3 for x in xs]
    expected = [1.0] * 4 + [(p - min(pdf)) / (max(pdf) - min(pdf)) for p in pdf]
    torch.testing.assert_close(probabilities, torch.tensor(expected, dtype=torch.float64))
    assert probabilities[4] == 1.0 and probabilities[-1] == 0.0  # first rank after n_top kept, last never
    torch.testing.assert_close(keep_probabilities(3, 2, 0.3), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    assert keep_probabilities(4, 4, 0.3).tolist() == [1.0] * 4


def test_keep_mask_keeps_the_top_ranks_and_the_rest_at_their_probability():
    generator = torch.Generator().manual_seed(0)
    masks = torch.stack([draw_keep_mask(12, 5, 0.3, generator) for _ in range(4000)]).double()
    assert masks[:, :5].all()
    torch.testing.assert_close(masks.mean(0), keep_probabilities(12, 5, 0.3), atol=0.03, rtol=0)


def test_select_classes_ranks_by_the_best_image_and_always_keeps_the_true_classes():
    prototypes = torch.eye(6)
    features = torch.tensor([[0.1, 0.0, 0.0, 0.9, 0.5, 0.2], [0.2, 0.0, 0.0, 0.1, 0.8, 0.3]])
    labels = torch.tensor([2, 2])
    # max similarity per class: 0.05, 0, +inf (label), 0.85, 0.93, 0.35 (normalised rows)
    keep = torch.tensor([True, True, False, True, False, False])  # ranks 0, 1, 3: classes 2, 4, 5
    kept, targets = select_classes(features, prototypes, labels, keep)
    assert kept.tolist() == [2, 4, 5] and targets.tolist() == [0, 0]
    # two true classes in the batch but only rank 0 kept by the mask: both stay (ranks 0 and 1)
    kept, targets = select_classes(features, prototypes, torch.tensor([5, 0]), torch.tensor([True] + [False] * 5))
    assert kept.tolist() == [0, 5] and targets.tolist() == [1, 0]


def test_batch_plans():
    labels = torch.tensor([0] * 9 + [1] * 4 + [2] * 3 + [3] * 8)
    generator = torch.Generator().manual_seed(0)
    plan = batch_plan(labels, 4, same_class=True, generator=generator)
    assert len(plan) == 2 + 1 + 0 + 2 and all(len(items) == 4 for items in plan)
    assert all(labels[items].unique().numel() == 1 for items in plan)
    used = torch.cat(plan)
    assert used.unique().numel() == used.numel()
    plan = batch_plan(labels, 5, same_class=False, generator=generator)
    assert len(plan) == 4 and torch.cat(plan).unique().numel() == 20
    assert any(labels[items].unique().numel() > 1 for items in plan)


# ------------------------------------------------------------------------ towers and the loss
def test_only_the_upper_blocks_and_the_output_layers_are_learnable(toy_world):  # noqa: F811
    model = build_model(toy_world, perturb=False)
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    expected = {name for name, _ in model.named_parameters()
                if name.startswith(("clip.visual.blocks.1.", "clip.visual.blocks.2.", "clip.text.blocks.1."))}
    expected |= {"clip.visual.ln_post.weight", "clip.visual.ln_post.bias", "clip.visual.proj",
                 "clip.text.ln_final.weight", "clip.text.ln_final.bias", "clip.text.text_projection"}
    assert names == expected
    width_v, width_t = 64, 32  # a block of width w: 12 w^2 + 13 w values
    count = sum(p.numel() for p in model.text_parameters() + model.image_parameters())
    assert count == 2 * (12 * width_v ** 2 + 13 * width_v) + (12 * width_t ** 2 + 13 * width_t) \
        + 2 * width_v + width_v * 32 + 2 * width_t + width_t * 32


def hand_prefix(model, x):
    visual = model.clip.visual
    h = visual.ln_pre(visual.embed(x))
    for block in visual.blocks[:START]:
        h = block(h)
    return h


def hand_image_from(model, h):
    visual = model.clip.visual
    for block in visual.blocks[START:]:
        h = block(h)
    return visual.ln_post(h[:, 0]) @ visual.proj


def hand_text(model, classes):
    text, ids = model.clip.text, model.token_ids[classes]
    x = text.embed(ids) + text.positional_embedding
    causal = torch.full((x.shape[1], x.shape[1]), float("-inf")).triu_(1)
    for block in text.blocks:
        x = block(x, attn_mask=causal)
    return text.ln_final(x[torch.arange(len(ids)), text.eot_positions(ids)]) @ text.text_projection


def test_cached_prefix_and_inference_equal_the_hand_computation(toy_world):  # noqa: F811
    model = build_model(toy_world)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(model.image_prefix(x), hand_prefix(model, x), **TOL)
        f = F.normalize(hand_image_from(model, hand_prefix(model, x)), dim=-1)
        t = F.normalize(hand_text(model, torch.arange(4)), dim=-1)
        expected = model.clip.logit_scale.exp() * f @ t.t()
        torch.testing.assert_close(model(x), expected, **TOL)
        pretrained = build_model(toy_world, perturb=False)
        assert (pretrained(x) - expected).abs().max() > 1e-2  # the tuned weights are the ones used


def test_prototypes_are_the_pretrained_zero_shot_text_features(toy_world):  # noqa: F811
    model = build_model(toy_world)
    pretrained = build_model(toy_world, perturb=False)
    with torch.no_grad():
        torch.testing.assert_close(model.prototypes, F.normalize(hand_text(pretrained, torch.arange(4)), dim=-1), **TOL)


def test_loss_on_cached_states_equals_an_independent_computation(toy_world):  # noqa: F811
    model = build_model(toy_world)
    model.keep_mask = torch.tensor([True, False, True, False])
    x, labels = images(), torch.tensor([1, 1, 3, 1])
    with torch.no_grad():
        hidden = model.image_prefix(x)
    loss, logits, terms = model.loss(hidden, labels)
    with torch.no_grad():
        f = hand_image_from(model, hand_prefix(model, x))
        similarity = F.normalize(f, dim=-1) @ model.prototypes.t()
        similarity[torch.arange(4), labels] = float("inf")
        order = similarity.max(0).values.argsort(descending=True)  # ranks 0, 1 are classes 1 and 3
        kept = sorted(order[[0, 1, 2]].tolist())  # rank 2 kept by the mask, rank 3 not
        t = F.normalize(hand_text(model, torch.tensor(kept)), dim=-1)
        kept_logits = model.clip.logit_scale.exp() * F.normalize(f, dim=-1) @ t.t()
        targets = torch.tensor([kept.index(y) for y in labels.tolist()])
        expected = -kept_logits.log_softmax(-1)[torch.arange(4), targets].mean()
    assert len(kept) == 3 and terms["classes"] == 3.0
    torch.testing.assert_close(loss, expected, **TOL)
    torch.testing.assert_close(logits[:, kept], kept_logits, **TOL)
    skipped = [c for c in range(4) if c not in kept]
    assert torch.isinf(logits[:, skipped]).all()
    loss.backward()
    tuned = model.text_parameters() + model.image_parameters()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tuned)


def test_text_tower_continues_from_rows_of_its_prefix(toy_world):  # noqa: F811
    model = build_model(toy_world)
    text, rows = model.clip.text, torch.tensor([3, 0])
    with torch.no_grad():
        prefix = text.prefix(model.token_ids, START)
        continued = text(model.token_ids[rows], hidden=prefix[rows], start=START).features
        torch.testing.assert_close(continued, hand_text(model, rows), **TOL)
    with pytest.raises(ValueError, match="start must be a block index"):
        text(model.token_ids, hidden=prefix, start=2)


# ------------------------------------------------------------------------------- the trainer
def pets_cfg(toy_world, tmp_path, *opts):  # noqa: F811
    """The base-to-novel recipe on the toy OxfordPets (5 classes, 8 training images each) and the tiny CLIP."""
    data, config, weights = toy_world
    return toy_pets_cfg("SkipTuning", "SkipTuning/vit_b16_bs4.yaml", data, tmp_path, (config, weights),
                        "INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", "TRAINER.SKIPTUNING.PREC", "fp32",
                        "TRAINER.SKIPTUNING.START_LAYER", str(START), "TRAINER.SKIPTUNING.CACHE_BATCH_SIZE", "16",
                        "DATASET.SUBSAMPLE_CLASSES", "base", *opts)


def test_trainer_groups_template_and_a_step_that_changes_only_the_tuned_weights(toy_world, tmp_path):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, "DATASET.NUM_SHOTS", "4"))
    model = trainer.model
    assert trainer.max_epoch == 20 and trainer.classnames == ["abyssinian", "american bulldog", "bengal"]
    assert model.token_ids.shape[0] == 3 and TEMPLATES["OxfordPets"] == "a bad photo of a {}, a type of pet."
    expected = Tokenizer(trainer.cfg.MODEL.BACKBONE.NAME)(["a bad photo of a abyssinian, a type of pet."])[0]
    assert torch.equal(model.token_ids[0], expected)  # the table's sentence, not the dataset's own template
    groups = trainer._optims["SkipTuning"].param_groups
    assert [group["initial_lr"] for group in groups] == [2e-5, 5e-6] and [g["lr"] for g in groups] == [1e-6, 1e-6]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in model.text_parameters()}
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in model.image_parameters()}

    trainer.before_train()
    trainer.epoch = 0
    trainer.before_epoch()
    loader = trainer.train_loader_x
    assert len(loader) == 3 * (4 // 4)  # 4 shots: same-class batches of 4, one per class
    batch = next(iter(loader))
    assert batch["hidden"].shape == (4, 1 + 16, 64) and batch["label"].unique().numel() == 1
    before_learned, before_frozen = learnable(model), frozen(model)
    trainer.batch_idx, trainer.num_batches = 0, len(loader)
    trainer.forward_backward(batch)
    changed = {name for name, value in learnable(model).items() if not torch.equal(value, before_learned[name])}
    assert changed == set(before_learned)
    for name, value in frozen(model).items():
        assert torch.equal(value, before_frozen[name]), name


def test_checkpoints_hold_the_tuned_weights_only_and_load_for_new_classes(toy_world, tmp_path, capsys):  # noqa: F811
    trainer = build_seeded(pets_cfg(toy_world, tmp_path / "base"))
    with torch.no_grad():
        for param in trainer.model.image_parameters() + trainer.model.text_parameters():
            param.add_(0.1)
    trainer.model.keep_mask = torch.tensor([True, True, False])
    trainer.save_model(19, str(tmp_path / "run"))
    path = tmp_path / "run" / "SkipTuning" / "model.pth.tar-20"
    checkpoint = load_checkpoint(str(path))
    tuned = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert set(checkpoint["state_dict"]) == tuned
    tuned_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
    all_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert tuned_bytes < os.path.getsize(path) < tuned_bytes + 100_000  # the frozen weights: 15x more
    assert all_bytes > 15 * tuned_bytes
    assert checkpoint["trainer_state"]["keep_mask"].tolist() == [True, True, False]

    novel = build_seeded(pets_cfg(toy_world, tmp_path / "new", "DATASET.SUBSAMPLE_CLASSES", "new", "TEST.ROLE", "new"))
    capsys.readouterr()
    novel.load_model(str(tmp_path / "run"), epoch=20)
    assert "Warning" not in capsys.readouterr().out
    for (name, param), (_, trained) in zip(novel.model.named_parameters(), trainer.model.named_parameters()):
        assert torch.equal(param, trained), name
    assert novel.classnames == ["boxer", "persian"] and novel.model.token_ids.shape[0] == 2


@pytest.mark.slow  # three trainings: kill and resume
def test_a_run_killed_after_an_epoch_resumes_to_the_uninterrupted_result(toy_world, tmp_path):  # noqa: F811
    # 5 classes, n_top 1, a flat pdf (scale 5): the keep mask is random (ranks 1..3 kept with 0.55, 0.23, 0)
    opts = ("OPTIM.MAX_EPOCH", "3", "OPTIM.LR", "0.05", "TRAINER.SKIPTUNING.IMAGE_LR", "0.02",
            "TRAIN.CHECKPOINT_FREQ", "1", "TEST.NO_TEST", "True", "DATASET.NUM_SHOTS", "4",
            "DATASET.SUBSAMPLE_CLASSES", "all", "TRAINER.SKIPTUNING.TOP_RATIO", "0.2",
            "TRAINER.SKIPTUNING.LAMBDA", "5.0")
    uninterrupted = build_seeded(pets_cfg(toy_world, tmp_path / "full", *opts))
    uninterrupted.train()

    killed = build_seeded(pets_cfg(toy_world, tmp_path / "killed", *opts))
    before_epoch = killed.before_epoch

    def die_in_epoch_two():
        if killed.epoch == 1:
            raise KeyboardInterrupt("killed")
        before_epoch()

    killed.before_epoch = die_in_epoch_two
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    assert sorted(os.listdir(tmp_path / "killed" / "SkipTuning")) == ["checkpoint", "model.pth.tar-1"]
    resumed = build_seeded(pets_cfg(toy_world, tmp_path / "killed", *opts))
    resumed.train()
    assert resumed.start_epoch == 1
    assert torch.equal(resumed.model.keep_mask, uninterrupted.model.keep_mask)
    for (name, param), (_, reference) in zip(resumed.model.named_parameters(), uninterrupted.model.named_parameters()):
        assert torch.equal(param, reference), name
    untrained = build_seeded(pets_cfg(toy_world, tmp_path / "untrained", *opts)).model
    assert all(not torch.equal(param, untrained.get_parameter(name))  # equality is not trivial
               for name, param in uninterrupted.model.named_parameters() if param.requires_grad)
    ours = resumed._optims["SkipTuning"].state_dict()["state"]
    theirs = uninterrupted._optims["SkipTuning"].state_dict()["state"]
    assert all(torch.equal(ours[key]["momentum_buffer"], theirs[key]["momentum_buffer"]) for key in theirs)


def test_epochs_per_dataset_and_the_protocol_runner_loads_that_checkpoint():
    method = Method("SkipTuning", os.path.join(ROOT, "configs/trainers/SkipTuning/vit_b16_bs4.yaml"), "vit_b16_bs4")
    datasets = os.path.join(ROOT, "configs/datasets")
    assert merged_max_epoch(method, os.path.join(datasets, "imagenet.yaml"), []) == 5
    assert merged_max_epoch(method, os.path.join(datasets, "sun397.yaml"), []) == 5
    assert merged_max_epoch(method, os.path.join(datasets, "food101.yaml"), []) == 5
    assert merged_max_epoch(method, os.path.join(datasets, "caltech101.yaml"), []) == 20
    divisor_2 = ["TRAINER.SKIPTUNING.EPOCH_DIVISOR", "2"]
    assert merged_max_epoch(method, os.path.join(datasets, "imagenet.yaml"), divisor_2) == 10
    few_shot = Method("SkipTuning", os.path.join(ROOT, "configs/trainers/SkipTuning/vit_b16_bs4_few_shot.yaml"), "fs")
    assert merged_max_epoch(few_shot, os.path.join(datasets, "food101.yaml"), []) == 10
    coop = Method("CoOp", os.path.join(ROOT, "configs/trainers/CoOp/vit_b16_ep50.yaml"), "vit_b16_ep50")
    assert merged_max_epoch(coop, os.path.join(datasets, "imagenet.yaml"), []) == 50  # other trainers: MAX_EPOCH


@pytest.mark.parametrize("opts, message", [
    (("TRAINER.SKIPTUNING.BATCHES", "class"), r"TRAINER\.SKIPTUNING\.BATCHES must be one of"),
    (("TRAINER.SKIPTUNING.LAMBDA", "0.0"), r"TRAINER\.SKIPTUNING\.LAMBDA .* must be > 0"),
    (("TRAINER.SKIPTUNING.TOP_RATIO", "0.0"), r"TRAINER\.SKIPTUNING\.TOP_RATIO must be > 0"),
    (("TRAINER.SKIPTUNING.TEMPLATE", "a photo"), r"TRAINER\.SKIPTUNING\.TEMPLATE must contain exactly one"),
    (("TRAINER.SKIPTUNING.START_LAYER", "2"), r"START_LAYER must be a block index 1\.\.1 of both towers"),
    (("TRAINER.SKIPTUNING.EPOCH_DIVISOR", "40"), r"OPTIM\.MAX_EPOCH 20 / EPOCH_DIVISOR 40 .* leaves no epoch"),
    (("TRAINER.SKIPTUNING.EPOCH_DIVISOR", "0"), r"TRAINER\.SKIPTUNING\.EPOCH_DIVISOR must be at least 1, got 0"),
    (("TRAINER.SKIPTUNING.PREC", "fp8"), r"TRAINER\.SKIPTUNING\.PREC must be one of"),
])
def test_config_errors(toy_world, tmp_path, opts, message):  # noqa: F811
    with pytest.raises(ConfigError, match=message):
        build_seeded(pets_cfg(toy_world, tmp_path, *opts))


def test_a_batch_larger_than_every_class_is_a_clear_error(toy_world, tmp_path):  # noqa: F811
    opts = ("DATASET.NUM_SHOTS", "4", "DATALOADER.TRAIN_X.BATCH_SIZE", "8")
    trainer = build_seeded(pets_cfg(toy_world, tmp_path, *opts))
    trainer.epoch = 0
    message = r"BATCH_SIZE 8 can be formed from the 12 training images \(same-class batches: no class has 8 images\)"
    with pytest.raises(ConfigError, match=message + ".*BATCHES random"):
        trainer.before_epoch()


@pytest.mark.slow  # three trainings: kill and resume
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights_and_accuracy(toy_world, tmp_path):  # noqa: F811
    """TRAIN.CHECKPOINT_ITERS 2 on cached epochs of 5 same-class batches: killed at global step 7 (epoch 2,
    after the mid-epoch checkpoint of its first batch), the resumed run draws epoch 2's cache and plan
    again, runs its 4 remaining batches and ends with the uninterrupted run's weights, momentum and accuracy."""
    opts = ("OPTIM.MAX_EPOCH", "2", "OPTIM.LR", "0.05", "TRAINER.SKIPTUNING.IMAGE_LR", "0.02",
            "TRAIN.CHECKPOINT_ITERS", "2", "TEST.NO_TEST", "True", "DATASET.NUM_SHOTS", "4",
            "DATASET.SUBSAMPLE_CLASSES", "all", "TRAINER.SKIPTUNING.TOP_RATIO", "0.2",
            "TRAINER.SKIPTUNING.LAMBDA", "5.0")
    uninterrupted = build_seeded(pets_cfg(toy_world, tmp_path / "full", *opts))
    uninterrupted.train()

    killed = build_seeded(pets_cfg(toy_world, tmp_path / "killed", *opts))
    forward_backward = killed.forward_backward

    def die_at_step_seven(batch):
        if killed.epoch * killed.num_batches + killed.batch_idx == 7:
            raise KeyboardInterrupt("killed")
        return forward_backward(batch)

    killed.forward_backward = die_at_step_seven
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    assert killed.num_batches == 5
    assert "model.pth.tar-1-batch1" in os.listdir(tmp_path / "killed" / "SkipTuning")
    resumed = build_seeded(pets_cfg(toy_world, tmp_path / "killed", *opts))
    steps = []
    forward_backward_resumed = resumed.forward_backward
    resumed.forward_backward = lambda batch: steps.append(batch["label"]) or forward_backward_resumed(batch)
    resumed.train()
    assert resumed.start_epoch == 1 and len(steps) == 4
    for (name, param), (_, reference) in zip(resumed.model.named_parameters(), uninterrupted.model.named_parameters()):
        assert torch.equal(param, reference), name
    ours = resumed._optims["SkipTuning"].state_dict()["state"]
    theirs = uninterrupted._optims["SkipTuning"].state_dict()["state"]
    assert all(torch.equal(ours[key]["momentum_buffer"], theirs[key]["momentum_buffer"]) for key in theirs)
    assert resumed.test() == uninterrupted.test()
    assert not any("-batch" in name for name in os.listdir(tmp_path / "killed" / "SkipTuning"))
