"""RAda in the full fine-tuning setting: classifier init, what each stage trains, the stage chain,
class-subset evaluation, the iteration schedule, and the torchrun (DDP, Gloo) code path."""
import copy
import os
import sys

import pytest
import torch
from baseline_setup import runner_and_tokenizer, toy_pets_cfg, trainer_node
from forked_runs import run_ranks
from torch.optim.lr_scheduler import LambdaLR

import datasets  # noqa: F401  (registers OxfordPets)
from trainers.rada_fft import RAdaFFTCLIP
from vlprompt.engine.fine_tuning import iteration_cosine_schedule
from vlprompt.config import ConfigError
from vlprompt.engine import build_trainer
from vlprompt.methods.template_head import TemplateCLIP
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree
from vlprompt.utils import load_checkpoint, setup_logger
from vlprompt.utils.logger import close_logger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["red star", "blue circle", "green square", "cat"]
TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]


def build(clip_files, stage):
    clip, tokenizer = runner_and_tokenizer(clip_files)
    torch.manual_seed(0)
    fft = RAdaFFTCLIP(clip, tokenizer, CLASSES, TEMPLATES, trainer_node("RADAFFT", STAGE=stage))
    fft.set_stage(stage)
    return fft, TemplateCLIP(clip, tokenizer, CLASSES, TEMPLATES)


def images(batch=4):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_classifier_starts_as_the_zero_shot_head(tiny_clip_files):
    fft, zero_shot = build(tiny_clip_files, stage=1)
    fft.eval(), zero_shot.eval()
    with torch.no_grad():
        torch.testing.assert_close(fft.classifier.weight, zero_shot.class_text_features())
        logits, mask = fft(images())
        torch.testing.assert_close(logits, zero_shot(images()), rtol=0, atol=1e-5)
    assert torch.equal(mask, torch.ones_like(mask))


@pytest.mark.parametrize("stage, trained_prefixes", [
    (1, ("mask_generator.",)),
    (2, ("mask_generator.", "classifier.", "clip.visual.")),
])
def test_each_stage_trains_its_parts(tiny_clip_files, stage, trained_prefixes):
    fft, _ = build(tiny_clip_files, stage)
    fft.train()
    before = copy.deepcopy(fft.state_dict())
    optimizer = torch.optim.AdamW([p for p in fft.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        logits, mask = fft(images())
        loss, terms = fft.objective(logits, mask, torch.tensor([0, 1, 2, 3]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert set(terms) == ({"ce", "mask_loss"} if stage == 1 else set())
    changed = {name for name in before if not torch.equal(before[name], fft.state_dict()[name])}
    assert changed and all(name.startswith(trained_prefixes) for name in changed)
    assert {prefix for prefix in trained_prefixes if any(name.startswith(prefix) for name in changed)} == set(
        trained_prefixes
    )
    assert not any(name.startswith("clip.text.") for name in changed)


def test_iteration_schedule_warms_up_then_follows_a_cosine():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.004)
    schedule = iteration_cosine_schedule(optimizer, warmup=4, total=12)
    lrs = []
    for _ in range(12):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    expected = [0.001, 0.002, 0.003, 0.004] + [
        0.004 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * k / 8))).item() for k in range(8)
    ]
    assert lrs == pytest.approx(expected)


# ----------------------------------------------------------------------------- trainer

@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fft_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:4], train=4, val=1, test=2)
    return root


def fft_cfg(data_root, output_dir, clip_files, stage, *opts):
    return toy_pets_cfg("RAdaFFT", f"RAdaFFT/toy_stage{stage}.yaml", data_root, output_dir, clip_files, *opts)


def generator_state(state_dict):
    return {k: v for k, v in state_dict.items() if k.startswith("mask_generator.")}


def test_stage_two_starts_from_the_chosen_stage_one_epoch_and_evaluates_on_class_subsets(
    data_root, tiny_clip_files, tmp_path
):
    stage1 = build_trainer(fft_cfg(data_root, tmp_path / "stage1", tiny_clip_files, 1))
    stage1.train()
    saved = load_checkpoint(str(tmp_path / "stage1" / "RAdaFFT" / "model.pth.tar-1"))["state_dict"]
    assert set(saved) == set(generator_state(stage1.model.state_dict()))  # stage 1 saves the generator only

    init = str(tmp_path / "stage1" / "RAdaFFT" / "model.pth.tar-1")
    stage2 = build_trainer(fft_cfg(data_root, tmp_path / "stage2", tiny_clip_files, 2, "MODEL.INIT_WEIGHTS", init))
    for name, value in generator_state(stage2.model.state_dict()).items():
        torch.testing.assert_close(value, saved[name])
    stage2.train()
    trained = stage2.model.classifier.weight.detach().clone()

    # Evaluate the stage-2 model on the base half of the classes: rows are picked by name.
    evaluation = build_trainer(fft_cfg(data_root, tmp_path / "eval", tiny_clip_files, 2,
                                       "DATASET.SUBSAMPLE_CLASSES", "base"))
    evaluation.load_model(str(tmp_path / "stage2"), epoch=2)
    rows = [stage2.classnames.index(name) for name in evaluation.classnames]
    torch.testing.assert_close(evaluation.model.classifier.weight, trained[rows])
    assert evaluation.test() >= 0


def test_config_errors(data_root, tiny_clip_files, tmp_path):
    with pytest.raises(ConfigError, match="STAGE must be 1"):
        build_trainer(fft_cfg(data_root, tmp_path, tiny_clip_files, 1, "TRAINER.RADAFFT.STAGE", "3"))
    with pytest.raises(ConfigError, match="cannot be cached"):
        build_trainer(fft_cfg(data_root, tmp_path, tiny_clip_files, 1, "FEATURE_CACHE.ENABLED", "True"))


@pytest.mark.parametrize("key, value", [("OPTIM.LR_SCHEDULER", "single_step"), ("OPTIM.WARMUP_EPOCH", "1")])
def test_iteration_schedule_rejects_the_epoch_schedule_keys_it_would_ignore(data_root, tiny_clip_files, tmp_path,
                                                                            key, value):
    with pytest.raises(ConfigError, match=f"{key} is .*LR_SCHEDULE \"iteration\""):
        build_trainer(fft_cfg(data_root, tmp_path, tiny_clip_files, 1, key, value))
    # the epoch schedule reads them: OPTIM's scheduler, not the per-iteration one
    epoch = build_trainer(fft_cfg(data_root, tmp_path, tiny_clip_files, 1, key, value,
                                  "TRAINER.RADAFFT.LR_SCHEDULE", "epoch"))
    assert not isinstance(epoch._scheds["RAdaFFT"], LambdaLR)


def test_other_ranks_log_to_their_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    setup_logger(str(tmp_path))
    print("rank one speaking")
    close_logger()
    assert "rank one speaking" in (tmp_path / "log-rank1.txt").read_text()
    assert not (tmp_path / "log.txt").exists()


def train_ranks(world_size, data_root, output_dir, clip_files, batch="4"):
    """Stage 1 by train.py as the ``world_size`` processes of a torchrun job (forked processes with
    torchrun's variables: forked_runs.run_ranks), global batch ``batch``."""
    command = [sys.executable, "train.py", "--root", data_root, "--trainer", "RAdaFFT", "--seed", "1",
               "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
               "--config-file", "configs/trainers/RAdaFFT/toy_stage1.yaml", "--output-dir", str(output_dir),
               "MODEL.BACKBONE.NAME", clip_files[0], "MODEL.BACKBONE.WEIGHTS", clip_files[1], "USE_CUDA", "False",
               "DATALOADER.TRAIN_X.BATCH_SIZE", batch]
    run_ranks(command, world_size, output_dir.parent / "console", cwd=ROOT)


@pytest.mark.e2e
def test_torchrun_code_path_with_one_gloo_process(data_root, tiny_clip_files, tmp_path):
    train_ranks(1, data_root, tmp_path / "run", tiny_clip_files)
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "DistributedDataParallel: 1 processes x 4 images per step" in log
    assert "* accuracy:" in log
    assert (tmp_path / "run" / "RAdaFFT" / "model.pth.tar-2").is_file()


@pytest.mark.slow
@pytest.mark.e2e
def test_two_gloo_processes_train_one_model(data_root, tiny_clip_files, tmp_path):
    train_ranks(2, data_root, tmp_path / "run", tiny_clip_files)
    assert "DistributedDataParallel: 2 processes x 2 images per step" in (tmp_path / "run" / "log.txt").read_text()
    assert "Checkpoint saved" not in (tmp_path / "run" / "log-rank1.txt").read_text()
    assert (tmp_path / "run" / "RAdaFFT" / "model.pth.tar-2").is_file()
