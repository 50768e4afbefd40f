"""vlprompt.utils: files, names, seeding, meters, registry, logger, checkpoints, RNG states."""
import copy
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from vlprompt.utils import (
    AverageMeter,
    CheckpointError,
    Logger,
    MetricMeter,
    PickledObject,
    Registry,
    atomic_write,
    check_availability,
    check_isfile,
    close_logger,
    collect_env_info,
    count_num_param,
    get_most_similar_str_to_a_from_b,
    get_rng_state,
    listdir_nohidden,
    load_checkpoint,
    load_pretrained_weights,
    mkdir_if_missing,
    read_image,
    read_json,
    resume_from_checkpoint,
    save_checkpoint,
    set_random_seed,
    set_rng_state,
    setup_logger,
    tolist_if_not,
    write_json,
)

ENGINE_UTILS_NAMES = [
    "setup_logger", "set_random_seed", "collect_env_info", "load_pretrained_weights", "load_checkpoint",
    "read_json", "write_json", "mkdir_if_missing", "listdir_nohidden", "check_isfile", "save_checkpoint",
    "resume_from_checkpoint", "count_num_param", "read_image", "check_availability", "tolist_if_not",
    "Registry", "AverageMeter", "MetricMeter", "Logger",
]


def test_star_import_exposes_every_dassl_utils_name():
    namespace = {}
    exec("from vlprompt.utils import *", namespace)
    missing = [name for name in ENGINE_UTILS_NAMES + ["atomic_write", "get_rng_state", "set_rng_state"]
               if name not in namespace]
    assert missing == []


# ---------------------------------------------------------------- files and names


def test_mkdir_if_missing_is_idempotent(tmp_path):
    target = tmp_path / "a" / "b"
    mkdir_if_missing(str(target))
    mkdir_if_missing(str(target))
    assert target.is_dir()


def test_check_isfile_warns_with_the_path(tmp_path):
    present = tmp_path / "x.txt"
    present.write_text("x")
    assert check_isfile(str(present)) is True
    with pytest.warns(UserWarning, match=re.escape(f'No file found at "{tmp_path / "nope.jpg"}"')):
        assert check_isfile(str(tmp_path / "nope.jpg")) is False


def test_write_json_format_and_round_trip(tmp_path):
    path = tmp_path / "sub" / "split.json"
    obj = {"train": [["a/1.jpg", 0, "cat"]], "val": []}
    write_json(obj, str(path))
    assert path.read_text() == (
        '{\n    "train": [\n        [\n            "a/1.jpg",\n            0,\n            "cat"\n'
        '        ]\n    ],\n    "val": []\n}'
    )
    assert read_json(str(path)) == obj


def test_atomic_write_keeps_old_content_when_the_writer_crashes(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old complete content")
    with pytest.raises(RuntimeError, match="crash"):
        with atomic_write(str(path), "wb") as f:
            f.write(b"new partial")
            raise RuntimeError("crash")
    assert path.read_bytes() == b"old complete content"
    assert os.listdir(tmp_path) == ["state.bin"]  # no temporary file left behind


def test_atomic_write_replaces_content_with_normal_permissions(tmp_path):
    path = tmp_path / "new" / "note.txt"
    with atomic_write(str(path), "w") as f:
        f.write("héllo\n")
    assert path.read_text(encoding="utf-8") == "héllo\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~umask)
    with pytest.raises(ValueError, match='mode "w" or "wb"'):
        with atomic_write(str(path), "a"):
            pass


def test_read_image_converts_to_rgb_and_reports_bad_files(tmp_path):
    gray = tmp_path / "gray.png"
    Image.new("L", (4, 3), color=7).save(gray)
    img = read_image(str(gray))
    assert img.mode == "RGB" and img.size == (4, 3) and img.getpixel((0, 0)) == (7, 7, 7)
    with pytest.raises(FileNotFoundError, match="No file found at"):
        read_image(str(tmp_path / "missing.png"))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    with pytest.raises(OSError, match=re.escape(f'Unable to read image "{broken}"')):
        read_image(str(broken))


def test_listdir_nohidden(tmp_path):
    for name in ["b", "a", ".hidden", "c.jpg"]:
        (tmp_path / name).write_text("")
    assert sorted(listdir_nohidden(str(tmp_path))) == ["a", "b", "c.jpg"]
    assert listdir_nohidden(str(tmp_path), sort=True) == ["a", "b", "c.jpg"]


def test_check_availability_message_lists_all_and_suggests():
    check_availability("CoOp", ["CoOp", "CoCoOp"])
    with pytest.raises(ValueError) as info:
        check_availability("MaPle", ["CoOp", "CoCoOp", "MaPLe"])
    assert str(info.value) == (
        "The requested one is expected to belong to ['CoOp', 'CoCoOp', 'MaPLe'], "
        "but got [MaPle] (do you mean [MaPLe]?)"
    )
    with pytest.raises(ValueError, match="nothing is available"):
        check_availability("CoOp", [])


def test_most_similar_string_and_tolist():
    assert get_most_similar_str_to_a_from_b("OxfordPet", ["Caltech101", "OxfordPets", "Food101"]) == "OxfordPets"
    assert get_most_similar_str_to_a_from_b("x", []) == ""
    assert tolist_if_not(3) == [3]
    assert tolist_if_not([3]) == [3]


def test_set_random_seed_makes_every_generator_repeat():
    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    set_random_seed(5)
    first = draw()
    set_random_seed(5)
    assert draw() == first
    set_random_seed(6)
    assert draw() != first


def test_collect_env_info_reports_versions_without_gpu():
    info = collect_env_info()
    assert info.splitlines()[0].startswith("Python: ")
    for prefix in ["PyTorch: ", "torchvision: ", "open_clip: ", "CUDA available: ", "Pillow: "]:
        assert any(line.startswith(prefix) for line in info.splitlines()), prefix
    if not torch.cuda.is_available():
        assert "GPUs: none (CUDA not available)" in info


# ---------------------------------------------------------------- meters and registry


def test_average_meter_mean_tensor_input_and_ema():
    meter = AverageMeter()
    meter.update(torch.tensor(2.0))
    meter.update(4.0, n=3)
    assert (meter.val, meter.sum, meter.count, meter.avg) == (4.0, 14.0, 4, 3.5)
    ema = AverageMeter(ema=True)
    ema.update(10.0)
    ema.update(20.0)
    assert ema.avg == pytest.approx(0.1 * 10.0 * 0.9 + 0.1 * 20.0)


def test_metric_meter_string_format_and_input_checks():
    meter = MetricMeter()
    meter.update({"loss": torch.tensor(1.5), "acc": 50.0})
    meter.update(None)
    meter.update({"loss": 1.0, "acc": 62.5})
    assert str(meter) == "loss 1.0000 (1.2500) acc 62.5000 (56.2500)"
    with pytest.raises(TypeError, match="must be a dictionary"):
        meter.update([1.0])


def test_registry_register_get_and_messages():
    registry = Registry("TRAINER")

    @registry.register()
    class CoOp:
        pass

    class MaPLe:
        pass

    registry.register(MaPLe)
    assert registry.get("CoOp") is CoOp
    assert registry.registered_names() == ["CoOp", "MaPLe"]
    with pytest.raises(KeyError) as info:
        registry.register(CoOp)
    assert info.value.args[0] == 'An object named "CoOp" was already registered in "TRAINER" registry'
    with pytest.raises(KeyError) as info:
        registry.get("Nope")
    assert info.value.args[0] == 'Object name "Nope" does not exist in "TRAINER" registry'

    class Replacement:
        pass

    Replacement.__name__ = "CoOp"
    registry.register(Replacement, force=True)
    assert registry.get("CoOp") is Replacement
    assert "CoOp" in registry and len(registry) == 2


# ---------------------------------------------------------------- logger


@pytest.fixture
def restore_stdout():
    original = sys.stdout
    yield
    close_logger()
    sys.stdout = original


def test_setup_logger_tees_stdout_and_never_overwrites_log_txt(tmp_path, capsys, restore_stdout):
    setup_logger(None)
    assert not isinstance(sys.stdout, Logger)

    out = tmp_path / "run"
    setup_logger(str(out))
    print("first run")
    close_logger()
    assert (out / "log.txt").read_text() == "first run\n"
    assert not isinstance(sys.stdout, Logger)

    setup_logger(str(out))
    print("second run")
    sys.stdout.flush()
    logs = sorted(os.listdir(out))
    assert logs[0] == "log.txt" and len(logs) == 2
    assert re.fullmatch(r"log\.txt-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}", logs[1])
    assert (out / logs[1]).read_text() == "second run\n"
    assert (out / "log.txt").read_text() == "first run\n"
    assert capsys.readouterr().out == "first run\nsecond run\n"


def test_setup_logger_twice_does_not_double_tee(tmp_path, capsys, restore_stdout):
    setup_logger(str(tmp_path / "a"))
    print("to a")
    setup_logger(str(tmp_path / "b" / "custom.log"))
    print("to b")
    close_logger()
    assert capsys.readouterr().out == "to a\nto b\n"
    assert (tmp_path / "a" / "log.txt").read_text() == "to a\n"
    assert (tmp_path / "b" / "custom.log").read_text() == "to b\n"


# ---------------------------------------------------------------- checkpoints


class TinyNet(nn.Module):
    """Linear 3 -> 2 plus a frozen 2 -> 2 layer and a buffer."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 2)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)
        self.register_buffer("counter", torch.zeros(1))


def _train_state(model, optimizer, epoch):
    return {
        "state_dict": model.state_dict(),
        "epoch": epoch,
        "optimizer": optimizer.state_dict(),
        "scheduler": None,
        "val_result": None,
        "rng_state": get_rng_state(),
    }


def test_save_checkpoint_layout_messages_and_weights_only_loading(tmp_path, capsys):
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    save_dir = str(tmp_path / "prompt_learner")
    state = _train_state(model, optimizer, 3)
    state["state_dict"] = {"module." + key: value for key, value in model.state_dict().items()}  # DataParallel keys
    path = save_checkpoint(state, save_dir, is_best=True)
    assert path == os.path.join(save_dir, "model.pth.tar-3")
    assert (tmp_path / "prompt_learner" / "checkpoint").read_text() == "model.pth.tar-3\n"
    assert capsys.readouterr().out == (
        f"Checkpoint saved to {path}\n"
        f'Best checkpoint saved to "{os.path.join(save_dir, "model-best.pth.tar")}"\n'
    )
    loaded = torch.load(path, weights_only=True)  # ours hold only tensors and plain containers
    assert list(loaded["state_dict"]) == list(model.state_dict())  # "module." stripped
    assert loaded["epoch"] == 3
    best = load_checkpoint(os.path.join(save_dir, "model-best.pth.tar"))
    assert torch.equal(best["state_dict"]["head.weight"], model.head.weight)
    assert capsys.readouterr().out == ""  # no fallback notice for our own files

    save_checkpoint({"state_dict": {}, "epoch": 4, "val_result": 71.5}, save_dir, model_name="model-best.pth.tar")
    assert (tmp_path / "prompt_learner" / "checkpoint").read_text() == "model-best.pth.tar\n"


def test_load_checkpoint_missing_truncated_and_pickled_objects(tmp_path, capsys):
    with pytest.raises(FileNotFoundError) as info:
        load_checkpoint(str(tmp_path / "nope.pth.tar"))
    assert str(info.value) == f'File is not found at "{tmp_path / "nope.pth.tar"}"'

    path = save_checkpoint({"state_dict": TinyNet().state_dict(), "epoch": 1}, str(tmp_path))
    data = Path(path).read_bytes()
    truncated = tmp_path / "truncated.pth.tar"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(truncated))
    assert f'Unable to load checkpoint from "{truncated}"' in str(info.value)
    assert "truncated or corrupt" in str(info.value)

    # Dassl-style: the "scheduler" entry holds a pickled scheduler object.
    optimizer = torch.optim.SGD(TinyNet().parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5.0)
    dassl_path = tmp_path / "dassl.pth.tar"
    torch.save({"state_dict": {}, "epoch": 2, "scheduler": {"successor": scheduler}}, dassl_path)
    capsys.readouterr()
    loaded = load_checkpoint(str(dassl_path))
    successor = loaded["scheduler"]["successor"]  # an inert stand-in: nothing was imported or run
    assert isinstance(successor, PickledObject) and not isinstance(successor, torch.optim.lr_scheduler.LRScheduler)
    assert type(successor).__name__ == "CosineAnnealingLR"
    assert (successor.T_max, successor.last_epoch) == (5.0, 0)
    assert capsys.readouterr().out == (
        f'Note: "{dassl_path}" holds pickled Python objects (builtins.dict, collections.defaultdict, '
        "torch.optim.lr_scheduler.CosineAnnealingLR, torch.optim.sgd.SGD); they were loaded as inert "
        "placeholders, without importing or running them\n"
    )


def test_rng_state_round_trip_through_weights_only_file(tmp_path):
    set_random_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.randn()  # and in NumPy's
    state = get_rng_state()
    expected = (random.random(), random.gauss(0, 1), float(np.random.randn()), float(torch.rand(1)))
    path = tmp_path / "rng.pt"
    torch.save(state, path)
    set_random_seed(99)
    set_rng_state(torch.load(path, weights_only=True))
    assert (random.random(), random.gauss(0, 1), float(np.random.randn()), float(torch.rand(1))) == expected


def test_resume_uses_highest_epoch_and_restores_everything(tmp_path, capsys):
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    save_dir = str(tmp_path / "model")
    for epoch in (1, 2):
        model.head(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        state = _train_state(model, optimizer, epoch)
        state["scheduler"] = scheduler.state_dict()
        state["state_dict"] = {k: v for k, v in state["state_dict"].items() if not k.startswith("frozen.")}
        save_checkpoint(state, save_dir)
    expected_draws = (random.random(), float(torch.rand(1)))
    # A later best-model save redirects the pointer file to an earlier epoch.
    best = copy.deepcopy(state)
    best["epoch"] = 1
    save_checkpoint(best, save_dir, model_name="model-best.pth.tar")
    capsys.readouterr()

    torch.manual_seed(123)
    random.seed(123)
    fresh = TinyNet()
    fresh.frozen.load_state_dict(model.frozen.state_dict())
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.5)
    start_epoch = resume_from_checkpoint(save_dir, fresh, fresh_optimizer, fresh_scheduler)

    assert start_epoch == 2
    assert capsys.readouterr().out == (
        f'Loading checkpoint from "{os.path.join(save_dir, "model.pth.tar-2")}"\n'
        "Loaded model weights\nLoaded optimizer\nLoaded scheduler\n"
        "Loaded random number generator states\nPrevious epoch: 2\n"
    )
    assert torch.equal(fresh.head.weight, model.head.weight)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.025
    assert fresh_scheduler.last_epoch == 2
    momentum = fresh_optimizer.state[fresh.head.weight]["momentum_buffer"]
    assert torch.equal(momentum, optimizer.state[model.head.weight]["momentum_buffer"])
    assert (random.random(), float(torch.rand(1))) == expected_draws


def test_resume_rejects_checkpoints_of_another_model(tmp_path):
    save_checkpoint({"state_dict": {"other.weight": torch.zeros(1)}, "epoch": 1}, str(tmp_path))
    with pytest.raises(CheckpointError) as info:
        resume_from_checkpoint(str(tmp_path), TinyNet())
    message = str(info.value)
    assert "missing keys ['counter', 'head.weight', 'head.bias']" in message
    assert "unexpected keys ['other.weight']" in message


def test_resume_without_epoch_files(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="expected files named model.pth.tar-N"):
        resume_from_checkpoint(str(tmp_path), TinyNet())
    save_checkpoint({"state_dict": TinyNet().state_dict(), "epoch": 4}, str(tmp_path), model_name="model-best.pth.tar")
    capsys.readouterr()
    assert resume_from_checkpoint(str(tmp_path), TinyNet()) == 4
    assert "resuming from \"model-best.pth.tar\" named by the pointer file" in capsys.readouterr().out


def test_load_pretrained_weights_matches_names_and_shapes(tmp_path, capsys):
    source = TinyNet()
    target = TinyNet()
    state = {"module.head.weight": source.head.weight.detach().clone(),
             "head.bias": torch.zeros(5),  # wrong shape
             "extra.weight": torch.zeros(1)}
    path = tmp_path / "init.pth"
    torch.save({"state_dict": state}, path)
    load_pretrained_weights(target, str(path))
    assert torch.equal(target.head.weight, source.head.weight)
    assert capsys.readouterr().out == (
        f"Successfully loaded pretrained weights from {path}\n"
        "Layers discarded due to unmatched keys or size: ['head.bias', 'extra.weight']\n"
    )
    torch.save({"nothing.here": torch.zeros(1)}, path)
    with pytest.warns(UserWarning, match=re.escape(f"Cannot load {path} (check the key names manually)")):
        load_pretrained_weights(target, str(path))


def test_count_num_param():
    model = TinyNet()
    assert count_num_param(model) == 3 * 2 + 2 + 2 * 2 + 2
    groups = [{"params": [model.head.weight]}, {"params": model.head.bias}]
    assert count_num_param(params=groups) == 8
    assert count_num_param(params=[model.frozen.weight]) == 4
    with pytest.raises(ValueError):
        count_num_param()



def test_a_checkpoint_without_frozen_weights_restores_a_model_that_reaches_them_by_two_names(tmp_path):
    """DePT, ATPrompt and LP hold CLIP under two names (e.g. ``clip`` and ``base.clip``): the saved
    state leaves out both names of a frozen parameter, and restoring must accept both as absent."""
    from vlprompt.utils.torchtools import restore_checkpoint

    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = nn.Module()
            self.base.clip = nn.Linear(3, 3).requires_grad_(False)
            self.clip = self.base.clip
            self.head = nn.Linear(3, 2)

    saved = Aliased()
    frozen = {name for name, p in saved.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert frozen == {"base.clip.weight", "base.clip.bias", "clip.weight", "clip.bias"}
    state = {key: value for key, value in saved.state_dict().items() if key not in frozen}
    restored = Aliased()
    restore_checkpoint({"state_dict": state}, str(tmp_path / "model.pth.tar-1"), restored)
    assert torch.equal(restored.head.weight, saved.head.weight)
    with pytest.raises(CheckpointError, match=r"missing keys \['head.bias'\]"):
        restore_checkpoint({"state_dict": {"head.weight": state["head.weight"]}}, "path", Aliased())
