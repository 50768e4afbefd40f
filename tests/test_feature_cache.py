"""The feature cache of frozen-image-encoder trainers: same training as without it, keys, storage."""
import glob
import os
import shutil

import pytest
import torch

import datasets  # noqa: F401  (registers OxfordPets)
import trainers.rada  # noqa: F401  (registers RAda and its config node)
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file, merge_from_list
from vlprompt.engine import build_trainer
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import set_random_seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:3], train=4, val=1, test=2)
    return root


def make_trainer(data_root, output_dir, clip_files, cache_dir, *opts, trainer="RAda"):
    """What train.py does: config (RAda toy recipe, 2 epochs), seed, build."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/datasets/oxford_pets.yaml"))
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers/RAda/toy.yaml"))
    cfg.TRAINER.NAME = trainer
    cfg.DATASET.ROOT, cfg.OUTPUT_DIR = data_root, str(output_dir)
    cfg.MODEL.BACKBONE.NAME, cfg.MODEL.BACKBONE.WEIGHTS = clip_files
    cfg.FEATURE_CACHE.DIR = str(cache_dir)
    cfg.SEED, cfg.USE_CUDA, cfg.VERBOSE = 1, False, False
    cfg.OPTIM.MAX_EPOCH, cfg.TRAIN.CHECKPOINT_FREQ = 2, 1
    merge_from_list(cfg, list(opts))
    cfg.freeze()
    if cfg.SEED >= 0:
        set_random_seed(cfg.SEED)
    return build_trainer(cfg)


def trained_run(data_root, output_dir, clip_files, cache_dir, *opts):
    trainer = make_trainer(data_root, output_dir, clip_files, cache_dir, *opts)
    trainer.train()
    return trainer


def cache_files(cache_dir):
    return sorted(glob.glob(os.path.join(str(cache_dir), "OxfordPets", "*.pt")))


def assert_same_generator(a, b):
    state_a, state_b = a.model.mask_generator.state_dict(), b.model.mask_generator.state_dict()
    for name in state_a:
        torch.testing.assert_close(state_a[name], state_b[name], **TOL)


@pytest.fixture(scope="module")
def uncached(data_root, tiny_clip_files, tmp_path_factory):
    base = tmp_path_factory.mktemp("uncached")
    return trained_run(data_root, base / "run", tiny_clip_files, base / "cache", "FEATURE_CACHE.ENABLED", "False")


@pytest.fixture(scope="module")
def cached(data_root, tiny_clip_files, tmp_path_factory):
    base = tmp_path_factory.mktemp("cached")
    trainer = trained_run(data_root, base / "run", tiny_clip_files, base / "cache")
    return trainer, base


def test_cached_training_equals_uncached_training(uncached, cached):
    trainer, base = cached
    assert trainer.feature_cache is not None and uncached.feature_cache is None
    assert_same_generator(trainer, uncached)
    assert trainer.last_test["metrics"]["accuracy"] == uncached.last_test["metrics"]["accuracy"]
    assert [os.path.basename(p).split("-")[0] for p in cache_files(base / "cache")] == ["test", "train"]
    # The RNG states in the checkpoints (hence any resume) are those of the uncached run.
    for epoch in (1, 2):
        states = [
            torch.load(os.path.join(str(t.output_dir), "mask_generator", f"model.pth.tar-{epoch}"),
                       weights_only=True)["rng_state"]["torch"]
            for t in (trainer, uncached)
        ]
        assert torch.equal(*states)


def test_cached_training_equals_uncached_training_with_loader_workers(data_root, tiny_clip_files, tmp_path):
    """With workers, each item is read with its own seed drawn from the global generator. Once the
    cached run has encoded its epochs, its loader's kept workers are ended (the garbage collector would
    end each only after a 5 s wait)."""
    runs = [
        trained_run(data_root, tmp_path / enabled, tiny_clip_files, tmp_path / "cache",
                    "FEATURE_CACHE.ENABLED", enabled, "DATALOADER.NUM_WORKERS", "1", "OPTIM.MAX_EPOCH", "1")
        for enabled in ("False", "True")
    ]
    assert_same_generator(*runs)
    assert runs[1].dm.train_loader_x.persistent_workers and runs[1].dm.train_loader_x._iterator is None


def test_a_second_run_reads_the_cache(data_root, tiny_clip_files, cached, monkeypatch, tmp_path):
    first, base = cached
    files = cache_files(base / "cache")

    def refuse(*args, **kwargs):
        raise AssertionError("the image encoder ran although the cache holds every feature")

    trainer = make_trainer(data_root, tmp_path / "again", tiny_clip_files, base / "cache")
    monkeypatch.setattr(trainer.model, "encode_image_features", refuse)
    monkeypatch.setattr(trainer.feature_cache.encoder, "encode", refuse)
    trainer.train()
    assert cache_files(base / "cache") == files
    assert_same_generator(trainer, first)


def fill_train_cache(data_root, output_dir, clip_files, cache_dir, *opts):
    """Build a trainer and compute (or read) its training views; returns the cached epochs."""
    trainer = make_trainer(data_root, output_dir, clip_files, cache_dir, *opts)
    return trainer.feature_cache.train_epochs(trainer.dm.train_loader_x, 0, trainer.max_epoch, lambda: 0)


def test_changed_transform_or_seed_gets_its_own_entry(data_root, tiny_clip_files, cached, tmp_path):
    _, base = cached
    cache_dir = tmp_path / "cache"
    shutil.copytree(base / "cache", cache_dir)
    before = set(cache_files(cache_dir))
    fill_train_cache(data_root, tmp_path / "run", tiny_clip_files, cache_dir, "INPUT.RRCROP_SCALE", "(0.5, 1.0)")
    after_transform = set(cache_files(cache_dir))
    new = after_transform - before
    assert len(new) == 1 and os.path.basename(new.pop()).startswith("train-")
    fill_train_cache(data_root, tmp_path / "run", tiny_clip_files, cache_dir, "SEED", "2")
    new = set(cache_files(cache_dir)) - after_transform
    assert len(new) == 1 and os.path.basename(new.pop()).startswith("train-")


def test_an_image_rewritten_in_place_gets_a_new_entry(data_root, tiny_clip_files, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    fill_train_cache(str(root), tmp_path / "run", tiny_clip_files, tmp_path / "cache")
    image = sorted((root / "oxford_pets" / "images").iterdir())[0]
    image.write_bytes(image.read_bytes())
    os.utime(image, ns=(0, 0))
    fill_train_cache(str(root), tmp_path / "run", tiny_clip_files, tmp_path / "cache")
    assert len(cache_files(tmp_path / "cache")) == 2


def test_damaged_or_foreign_cache_files_are_recomputed(data_root, tiny_clip_files, cached, tmp_path, capsys):
    _, base = cached
    cache_dir = tmp_path / "cache"
    shutil.copytree(base / "cache", cache_dir)
    train_file = [p for p in cache_files(cache_dir) if os.path.basename(p).startswith("train-")][0]
    original = torch.load(train_file, weights_only=True)
    with open(train_file, "wb") as f:
        f.write(b"not a torch file")
    recomputed = fill_train_cache(data_root, tmp_path / "run", tiny_clip_files, cache_dir)
    assert "ignoring unreadable" in capsys.readouterr().out
    torch.testing.assert_close(recomputed.features, original["entry"]["features"], **TOL)
    original["key"]["seed"] = 99  # a file whose stored key does not match its name
    torch.save(original, train_file)
    fill_train_cache(data_root, tmp_path / "run", tiny_clip_files, cache_dir)
    assert "written for other settings" in capsys.readouterr().out
    assert torch.load(train_file, weights_only=True)["key"]["seed"] == 1


def test_resume_with_the_cache_is_exact(data_root, tiny_clip_files, uncached, tmp_path):
    run = tmp_path / "run"
    whole = trained_run(data_root, run, tiny_clip_files, tmp_path / "cache").model.mask_generator.state_dict()
    folder = run / "mask_generator"
    os.remove(folder / "model.pth.tar-2")  # as if the run had stopped after epoch 1
    (folder / "checkpoint").write_text("model.pth.tar-1\n")
    resumed = trained_run(data_root, run, tiny_clip_files, tmp_path / "cache")
    assert resumed.start_epoch == 1
    assert_same_generator(resumed, uncached)
    # bit for bit: the resumed run caches epoch 2 alone, and its features are those of the entry of epochs 1..2
    for name, value in resumed.model.mask_generator.state_dict().items():
        assert torch.equal(value, whole[name]), name



def test_a_run_resumed_from_its_last_checkpoint_only_evaluates(data_root, tiny_clip_files, uncached, tmp_path):
    """Killed after its last epoch's checkpoint (during the final evaluation), a cached run
    resumes with no epoch left to cache or train."""
    run = tmp_path / "run"
    trained_run(data_root, run, tiny_clip_files, tmp_path / "cache")
    resumed = trained_run(data_root, run, tiny_clip_files, tmp_path / "cache")
    assert resumed.start_epoch == resumed.max_epoch == 2
    assert_same_generator(resumed, uncached)


def test_unseeded_runs_keep_training_views_in_memory(data_root, tiny_clip_files, tmp_path):
    trainer = make_trainer(data_root, tmp_path / "run", tiny_clip_files, tmp_path / "cache", "SEED", "-1")
    trainer.train()
    assert [os.path.basename(p).split("-")[0] for p in cache_files(tmp_path / "cache")] == ["test"]


def test_zero_shot_evaluation_reads_cached_test_features(data_root, tiny_clip_files, tmp_path):
    results = []
    for enabled in ("False", "True", "True"):
        trainer = make_trainer(data_root, tmp_path / enabled, tiny_clip_files, tmp_path / "cache",
                               "FEATURE_CACHE.ENABLED", enabled, trainer="ZeroshotCLIP")
        results.append(trainer.test())
    assert results[0] == results[1] == results[2]
    assert len(cache_files(tmp_path / "cache")) == 1


def test_trainers_that_change_the_image_encoder_refuse_the_cache(data_root, tiny_clip_files, tmp_path):
    with pytest.raises(ConfigError, match="CoOp changes what its image encoder computes"):
        make_trainer(data_root, tmp_path / "run", tiny_clip_files, tmp_path / "cache", trainer="CoOp")
    with pytest.raises(ConfigError, match="K_TRANSFORMS"):
        make_trainer(data_root, tmp_path / "run", tiny_clip_files, tmp_path / "cache", "DATALOADER.K_TRANSFORMS", "2")


class _EpochViews:
    """Training-loader stand-in: every epoch, 3 batches of 2 images [2, 3, 2, 2] (image i is filled
    with i), with labels and dataset positions."""

    dataset = range(6)

    def __iter__(self):
        for start in range(0, 6, 2):
            index = torch.arange(start, start + 2)
            yield {"img": index.float().view(2, 1, 1, 1).expand(2, 3, 2, 2), "label": index % 3, "index": index}


def test_an_epochs_features_do_not_depend_on_the_epochs_cached_before_it():
    """A run resumed after epoch 1 caches epochs 2..3 only: their features must be those of the
    entry of epochs 1..3, also with an encoder whose output depends on its whole batch (as real
    kernels do at the last bit)."""
    from contextlib import nullcontext

    from vlprompt.data.feature_cache import FeatureCache, _ChunkedEncoder

    def encode(images):  # [B, 3, 2, 2] -> [B, 2]: the image's value plus the batch's sum
        return images.flatten(1)[:, :2] + images.sum()

    def entry(first_epoch):
        cache = FeatureCache.__new__(FeatureCache)
        cache.encoder = _ChunkedEncoder(encode, 4, "cpu", nullcontext)
        return cache._compute_train(_EpochViews(), first_epoch, 3)

    whole, resumed = entry(0), entry(1)
    assert whole["features"].shape == (18, 2) and resumed["features"].shape == (12, 2)
    assert torch.equal(resumed["features"], whole["features"][6:])
    assert torch.equal(resumed["labels"], whole["labels"][6:])
