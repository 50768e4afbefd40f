"""RAda test-time training: entropy objective, per-image views, order independence, resets, RAda-dagger."""
import copy
import math
import os
import random

import pytest
import torch
import torchvision.transforms as T
from baseline_setup import toy_pets_cfg
from PIL import Image

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.clip.preprocess import resolve_input
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.data.test_time_views import ViewAugmenter, image_seed
from vlprompt.engine import build_trainer
from vlprompt.engine.test_time import average_prediction_entropy, entropy_per_view
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_entropies_match_hand_computation():
    uniform = torch.zeros(2, 4)
    torch.testing.assert_close(entropy_per_view(uniform), torch.full((2,), math.log(4)))
    confident = torch.tensor([[100.0, 0.0], [0.0, 100.0]])  # two opposite certain views
    assert average_prediction_entropy(confident).item() == pytest.approx(math.log(2), abs=1e-6)
    assert average_prediction_entropy(confident[:1]).item() == pytest.approx(0.0, abs=1e-6)


def base_cfg(*opts):
    """The toy RAdaTTT config on the repository's tiny CLIP (the toy's own, output/toy/tiny-clip.json, is written
    by tools/make_toy_setup.py; both are 32 px with CLIP's statistics), its preprocessing resolved."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers/RAdaTTT/toy.yaml"))
    merge_from_list(cfg, ["MODEL.BACKBONE.NAME", os.path.join(ROOT, "configs/clip/tiny-synthetic-clip.json"), *opts])
    return resolve_input(cfg)[0]


@pytest.mark.parametrize("augmix", [False, True])
def test_views_depend_only_on_the_image_seed(augmix):
    augmenter = ViewAugmenter(base_cfg(), num_views=5, augmix=augmix)
    image = Image.fromarray((torch.rand(40, 48, 3) * 255).byte().numpy())
    torch.manual_seed(0)
    first = augmenter(image, seed=7)
    torch.manual_seed(123)  # the global stream does not matter, and is left untouched
    state = torch.get_rng_state()
    assert torch.equal(augmenter(image, seed=7), first)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.shape == (5, 3, 32, 32)
    assert torch.equal(first[0], augmenter.test_view(image))
    assert not torch.equal(augmenter(image, seed=8)[1:], first[1:])
    assert image_seed(1, "/data/a/x.jpg", "/data") == image_seed(1, "/mnt/a/x.jpg", "/mnt")
    assert image_seed(1, "/data/a/x.jpg", "/data") != image_seed(2, "/data/a/x.jpg", "/data")


def test_views_follow_input_transforms():
    """Without "random_resized_crop" the views are the image resized to INPUT.SIZE, flipped
    at random with "random_flip" (INPUT.TRANSFORMS is honoured, not replaced by fixed crops)."""
    cfg = base_cfg("INPUT.TRANSFORMS", "['random_flip', 'normalize']")
    image = Image.fromarray((torch.rand(40, 48, 3) * 255).byte().numpy())
    resized = T.Compose([
        T.Resize((32, 32), interpolation=T.InterpolationMode.BICUBIC), T.ToTensor(),
        T.Normalize(cfg.INPUT.PIXEL_MEAN, cfg.INPUT.PIXEL_STD),
    ])(image)
    views = ViewAugmenter(cfg, num_views=9)(image, seed=3)
    flipped = [bool(torch.equal(view, resized.flip(-1))) for view in views[1:]]
    assert all(flipped[i] or torch.equal(view, resized) for i, view in enumerate(views[1:]))
    assert any(flipped) and not all(flipped)


@pytest.mark.parametrize("transforms", ["['random_crop', 'normalize']", "['random_resized_crop', 'colorjitter']"])
def test_unsupported_view_transforms_are_rejected_with_the_key(transforms):
    with pytest.raises(ConfigError, match=r"INPUT.TRANSFORMS .* support only \['random_resized_crop'"):
        ViewAugmenter(base_cfg("INPUT.TRANSFORMS", transforms), num_views=4)


# ----------------------------------------------------------------------------- trainer

@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ttt_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:3], train=2, val=1, test=2)
    return root


def make_trainer(data_root, clip_files, output_dir, *opts, trainer="RAdaTTT", config="RAdaTTT/toy.yaml"):
    return build_trainer(toy_pets_cfg(trainer, config, data_root, output_dir, clip_files, *opts))


def predictions(trainer, data_source, batch_size):
    """{image path: logits} from episodes over ``data_source`` in its order."""
    loader = trainer.build_views_loader(data_source)
    loader = torch.utils.data.DataLoader(loader.dataset, batch_size=batch_size, shuffle=False)
    trainer.start_episodes()
    out = {}
    with torch.no_grad():
        for batch in loader:
            for path, logits in zip(batch["impath"], trainer.model_inference(batch["img"])):
                out[path] = logits
    return out


@pytest.fixture(scope="module")
def ttt(data_root, tiny_clip_files, tmp_path_factory):
    return make_trainer(data_root, tiny_clip_files, tmp_path_factory.mktemp("ttt"))


def test_prediction_does_not_depend_on_the_order_of_the_test_set(ttt):
    test = list(ttt.dm.dataset.test)
    reference = predictions(ttt, test, batch_size=2)
    shuffled = test[:]
    random.Random(0).shuffle(shuffled)
    assert [d.impath for d in shuffled] != [d.impath for d in test]
    again = predictions(ttt, shuffled, batch_size=3)
    assert reference.keys() == again.keys()
    for path in reference:
        assert torch.equal(reference[path], again[path])


def test_weights_are_restored_and_adaptation_changes_predictions(ttt, data_root, tiny_clip_files, tmp_path):
    start = copy.deepcopy(ttt.model.mask_generator.state_dict())
    accuracy = ttt.test()
    assert 0 <= accuracy <= 100 and ttt.last_test["num_samples"] == 6
    for name, value in ttt.model.mask_generator.state_dict().items():
        assert torch.equal(value, start[name])
    test = list(ttt.dm.dataset.test)
    adapted = predictions(ttt, test, batch_size=2)
    unadapted = predictions(make_trainer(data_root, tiny_clip_files, tmp_path, "TRAINER.RADATTT.STEPS", "0"),
                            test, batch_size=2)
    assert any(not torch.allclose(adapted[path], unadapted[path]) for path in adapted)


def test_rada_dagger_starts_every_episode_from_a_trained_generator(data_root, tiny_clip_files, tmp_path):
    eft = make_trainer(data_root, tiny_clip_files, tmp_path / "eft", "OPTIM.MAX_EPOCH", "1",
                       trainer="RAda", config="RAda/toy.yaml")
    eft.train()
    trained = eft.model.mask_generator.state_dict()
    dagger = make_trainer(data_root, tiny_clip_files, tmp_path / "ttt")
    dagger.load_model(str(tmp_path / "eft"), epoch=1)
    dagger.test()
    for name, value in dagger.model.mask_generator.state_dict().items():
        assert torch.equal(value, trained[name])
        assert torch.equal(dagger.episode_start[name], trained[name])


def test_config_checks_and_training_is_refused(data_root, tiny_clip_files, ttt, tmp_path):
    with pytest.raises(ConfigError, match="SELECTION"):
        make_trainer(data_root, tiny_clip_files, tmp_path, "TRAINER.RADATTT.SELECTION", "0.05")
    with pytest.raises(ConfigError, match="INPUT.TRANSFORMS"):
        make_trainer(data_root, tiny_clip_files, tmp_path, "INPUT.TRANSFORMS", "['random_flip', 'gaussian_noise']")
    with pytest.raises(RuntimeError, match="--eval-only"):
        ttt.train()
