"""ObjectNet: the release's mapping files, the ImageNet prediction map, the
1-pixel frame, WiSE-FT-style evaluation through the engine, and the layout errors."""
import os
import shutil

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import datasets  # noqa: F401  (registers the datasets)
import trainers  # noqa: F401  (registers the trainers)
from baseline_setup import toy_pets_cfg
from mini_datasets import (
    OBJECTNET_IMAGENET, OBJECTNET_IMAGENET_LABELS, TEST_ONLY_PER_CLASS, cfg_for, write_imagenet, write_objectnet,
)
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default
from vlprompt.data import DataManager
from vlprompt.data.datasets import DatasetLayoutError, build_dataset
from vlprompt.data.prediction_map import PredictionMap
from vlprompt.engine import build_trainer
from vlprompt.engine.trainer import SimpleTrainer
from vlprompt.testing import write_tiny_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGENET_NAMES = [name for _, name in sorted(OBJECTNET_IMAGENET)]  # ImageNet label order (sorted WNIDs)


@pytest.fixture
def root(tmp_path):
    write_objectnet(str(tmp_path))
    return tmp_path


def test_classes_follow_the_release_mappings(root):
    dataset = build_dataset(cfg_for(root, "ObjectNet"))
    assert dataset.classnames == ["Fish", "Shark", "Great white"]  # folders fish, shark, white_shark
    # ILSVRC-id lines are turned into ImageNet labels by pytorch_to_imagenet_2012_id.json; the two
    # "shark" lines (tiger shark, hammerhead) both count; alarm_clock (not mapped) is not read.
    assert dataset.imagenet_labels == OBJECTNET_IMAGENET_LABELS
    prediction_map = dataset.prediction_map
    assert prediction_map.classnames == IMAGENET_NAMES
    assert prediction_map.labels.tolist() == [0, 0, 2, 1, 1, -1]  # electric ray: no ObjectNet class
    assert {os.path.basename(os.path.dirname(d.impath)) for d in dataset.test} == {"fish", "shark", "white_shark"}
    assert len(dataset.test) == 3 * TEST_ONLY_PER_CLASS and all(d.impath.endswith(".png") for d in dataset.test)
    with open(os.path.join(ROOT, "configs", "datasets", "objectnet.yaml")) as f:
        assert yaml.safe_load(f) == {"DATASET": {"NAME": "ObjectNet"}}


def test_projection_takes_the_best_class_of_each_label():
    prediction_map = PredictionMap(["a", "b", "c", "d", "e"], [0, 1, 0, -1, 1], num_labels=2)
    logits = torch.tensor([[1.0, 2.0, 3.0, 9.0, 0.0],    # d (unmapped) is highest: ignored -> c -> label 0
                           [5.0, 4.0, -1.0, 0.0, 6.0]])  # e -> label 1
    assert prediction_map.project(logits).tolist() == [[3.0, 2.0], [5.0, 6.0]]
    assert prediction_map.classes_of(1) == [1, 4]
    with pytest.raises(ValueError, match=r"expects logits \[B, 5\]"):
        prediction_map.project(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"label\(s\) \[2\] have no class"):
        PredictionMap(["a", "b"], [0, 1], num_labels=3)


def test_images_lose_their_one_pixel_frame(root):
    cfg = cfg_for(root, "ObjectNet")
    cfg.INPUT.SIZE = (8, 8)
    cfg.INPUT.TRANSFORMS = ()
    cfg.DATALOADER.NUM_WORKERS = 0
    image = next(iter(DataManager(cfg).test_loader))["img"]
    assert image.shape[1:] == (3, 8, 8)
    # The 10x10 PNG is a blue 8x8 picture in a red frame: after the crop only blue is left.
    assert torch.allclose(image[:, 2], torch.ones_like(image[:, 2])) and image[:, 0].abs().max() == 0


def _zero_shot_trainer(root, output_dir):
    config, weights = write_tiny_clip(str(root / "clip"), name="tiny-clip-objectnet")
    cfg = get_cfg_default()
    extend_cfg(cfg)
    cfg.SEED = 1
    cfg.USE_CUDA = False
    cfg.OUTPUT_DIR = str(output_dir)
    cfg.DATASET.ROOT = str(root)
    cfg.DATASET.NAME = "ObjectNet"
    cfg.INPUT.SIZE = (32, 32)
    cfg.DATALOADER.NUM_WORKERS = 0
    cfg.DATALOADER.TEST.BATCH_SIZE = 4
    cfg.MODEL.BACKBONE.NAME = config
    cfg.MODEL.BACKBONE.WEIGHTS = weights
    cfg.TRAINER.NAME = "ZeroshotCLIP"
    cfg.freeze()
    return build_trainer(cfg)


def _random_pictures(root):
    """Distinct random pictures, so that the predictions differ between images."""
    for number, path in enumerate(sorted(root.glob("objectnet/objectnet-1.0/images/*/*.png"))):
        rng = np.random.default_rng(number)
        Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(path)


def _expected_accuracy(trainer):
    """Accuracy by the rule itself: correct iff the best-scoring mapped ImageNet class is one of the label's."""
    mapped = [c for c, label in enumerate(trainer.dm.dataset.prediction_map.labels.tolist()) if label >= 0]
    correct = total = 0
    trainer.set_model_mode("eval")
    with torch.no_grad():
        for batch in trainer.test_loader:
            logits = trainer.model_inference(batch["img"])
            assert logits.shape[1] == len(IMAGENET_NAMES)
            for row, label in zip(logits.tolist(), batch["label"].tolist()):
                best = max(mapped, key=lambda c: row[c])
                correct += best in OBJECTNET_IMAGENET_LABELS[label]
                total += 1
    assert total == 3 * TEST_ONLY_PER_CLASS
    return 100.0 * correct / total


def test_evaluation_scores_imagenet_classes_and_counts_any_mapped_one(root, tmp_path):
    """The model classifies over the ImageNet names; a prediction is correct iff the best mapped class is the image's."""
    _random_pictures(root)
    trainer = _zero_shot_trainer(root, tmp_path / "out")
    assert trainer.classnames == IMAGENET_NAMES and trainer.num_classes == 3
    with trainer.model.evaluation():
        expected = _expected_accuracy(trainer)
    assert trainer.test() == pytest.approx(expected)
    assert trainer.last_test["num_samples"] == 3 * TEST_ONLY_PER_CLASS


def test_rada_fft_trained_on_imagenet_evaluates_on_objectnet_with_all_its_rows(root, tmp_path, tiny_clip_files):
    """The FFT target path: a stage-2 RAdaFFT run on ImageNet, then --eval-only on ObjectNet keeps every
    classifier row (ImageNet's class list) and is scored by the prediction map."""
    write_imagenet(str(root), OBJECTNET_IMAGENET)
    _random_pictures(root)
    fft = build_trainer(toy_pets_cfg("RAdaFFT", "RAdaFFT/toy_stage2.yaml", str(root), tmp_path / "fft", tiny_clip_files,
                                     "DATASET.NAME", "ImageNet", "OPTIM.MAX_EPOCH", "1"))
    fft.train()
    trained = fft.model.classifier.weight.detach().clone()

    evaluation = build_trainer(toy_pets_cfg("RAdaFFT", "RAdaFFT/toy_stage2.yaml", str(root), tmp_path / "eval",
                                            tiny_clip_files, "DATASET.NAME", "ObjectNet"))
    evaluation.load_model(str(tmp_path / "fft"), epoch=1)
    torch.testing.assert_close(evaluation.model.classifier.weight, trained)
    assert evaluation.test() == pytest.approx(_expected_accuracy(evaluation))


def test_training_on_objectnet_is_refused(root, tmp_path):
    trainer = _zero_shot_trainer(root, tmp_path / "out")
    with pytest.raises(ConfigError, match="cannot be trained on: evaluate a model trained on that dataset with --eval-only"):
        SimpleTrainer.train(trainer)  # the engine's training entry (ZeroshotCLIP's own train refuses anyway)


def test_missing_folder_and_files_give_the_layout_error(root, tmp_path):
    with pytest.raises(DatasetLayoutError) as error:
        build_dataset(cfg_for(tmp_path / "empty", "ObjectNet"))
    message = str(error.value)
    assert 'Dataset ObjectNet: no folder "objectnet" found' in message
    assert "Expected layout under DATASET.ROOT:\nobjectnet/\n  objectnet-1.0/" in message

    shutil.rmtree(root / "objectnet" / "objectnet-1.0" / "images" / "shark")
    with pytest.raises(DatasetLayoutError, match="lacks 1 of the 3 class folders mapped to ImageNet .first: shark."):
        build_dataset(cfg_for(root, "ObjectNet"))

    os.remove(root / "objectnet" / "objectnet-1.0" / "mappings" / "pytorch_to_imagenet_2012_id.json")
    with pytest.raises(DatasetLayoutError, match="lacks objectnet-1.0/mappings/pytorch_to_imagenet_2012_id.json"):
        build_dataset(cfg_for(root, "ObjectNet"))


def test_unknown_imagenet_name_is_named(root):
    path = root / "objectnet" / "objectnet-1.0" / "mappings" / "objectnet_to_imagenet_1k.json"
    path.write_text('{"Fish": "tench, Tinca tinca; goldfsh"}')
    with pytest.raises(DatasetLayoutError, match=r"ImageNet names absent from .*imagenet_to_label_2012_v2: \['goldfsh'\]"):
        build_dataset(cfg_for(root, "ObjectNet"))
