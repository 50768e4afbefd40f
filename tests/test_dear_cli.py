"""DeAR end to end through train.py on a miniature OxfordPets tree with a tiny random CLIP,
using the real base-to-novel config with the tiny model's overrides."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from vlprompt.clip.head_roles import parse_role_map
from vlprompt.testing import write_oxford_pets_tree, write_tiny_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f for f in os.listdir(os.path.join(ROOT, "configs/trainers/DeAR")) if f.startswith("vit_b16"))
TINY_ROLES = {
    "num_layers": 3, "num_heads": 4, "attributes": ["color", "shape"],
    "roles": {2: ["A color", "G", "M", "O text"], 3: ["A shape", "A color", "G style", "M"]},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("dear_cli")
    config, weights = write_tiny_clip(str(base), name="tiny-clip-dear")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=3)
    role_map = str(base / "roles.yaml")
    parse_role_map(TINY_ROLES).save(role_map)
    return base, config, weights, role_map


def run_train(setup, output_dir, *extra):
    """train.py with the base-to-novel config and the tiny model's overrides; ``extra``:
    flags (--x [value]) and KEY VALUE overrides, which go last."""
    base, config, weights, role_map = setup
    flags, opts, items = [], [], list(extra)
    while items:
        item = items.pop(0)
        if item == "--eval-only":
            flags.append(item)
        elif item.startswith("--"):
            flags += [item, items.pop(0)]
        else:
            opts += [item, items.pop(0)]
    command = [
        sys.executable, "train.py", "--root", str(base / "data"), "--trainer", "DeAR", "--seed", "1",
        "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
        "--config-file", "configs/trainers/DeAR/vit_b16_base2new.yaml", "--output-dir", str(output_dir), *flags,
        "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, "INPUT.SIZE", "(32, 32)",
        "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "4", "OPTIM.MAX_EPOCH", "2",
        "TRAINER.DEAR.ROLE_MAP", role_map, "TRAINER.DEAR.INJECT_LAYER", "2",
        "TRAINER.DEAR.ATTRIBUTES", "['color', 'shape']", "DATASET.NUM_SHOTS", "4", *opts,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_train_then_evaluate_new_classes_with_decoupled_inference(setup):
    base = setup[0]
    run_dir = base / "train_base"
    result = run_train(setup, run_dir, "DATASET.SUBSAMPLE_CLASSES", "base")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert "Head roles (role) of image layers 2..3: 3 A, 1 O, 2 G, 2 M" in log
    assert re.search(r"epoch \[2/2\] batch \[\d+/\d+\] .* ce [\d.]+ \([\d.]+\) reg [\d.]+ \([\d.]+\) "
                     r"fusion [\d.]+ \([\d.]+\) acc", log), log[-2000:]
    checkpoint = torch.load(run_dir / "prompt_learner" / "model.pth.tar-2", weights_only=True)
    assert sorted(checkpoint["state_dict"]) == ["attr_proj", "attr_tokens", "fusion_logits", "text_tokens"]
    assert json.loads((run_dir / "results.json").read_text())["trainer"] == "DeAR"

    new_dir = base / "test_new"
    result = run_train(setup, new_dir, "--eval-only", "--model-dir", str(run_dir), "--load-epoch", "2",
                       "DATASET.SUBSAMPLE_CLASSES", "new", "TRAINER.DEAR.INFERENCE", "cls")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (new_dir / "log.txt").read_text()
    assert "Loading weights to prompt_learner" in log and "missing" not in log
    assert re.search(r"^\* accuracy: \d+\.\d%$", log, re.M)


def test_bad_role_map_fails_before_loading_data(setup):
    base = setup[0]
    bad = base / "bad_roles.yaml"
    bad.write_text("num_layers: 3\nnum_heads: 4\nattributes: [color]\n"
                   "roles:\n  2: [A color, G, M, M]\n  3: [A hue, G, M, M]\n")
    result = run_train(setup, base / "bad", "TRAINER.DEAR.ROLE_MAP", str(bad))
    assert result.returncode == 2
    assert 'layer 3, head 0: unknown attribute "hue"' in result.stderr
    assert "Traceback" not in result.stderr and "Building transform" not in result.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_merge_and_pass_check_cfg(name):
    from trainers.dear import check_dear_config
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, os.path.join(ROOT, "configs/trainers/DeAR", name))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        check_dear_config(cfg.TRAINER.DEAR, cfg.MODEL.BACKBONE)
    finally:
        os.chdir(cwd)
    assert cfg.OPTIM.NAME == "adamw" and cfg.OPTIM.LR == 1e-3 and cfg.OPTIM.MAX_EPOCH == 10
    assert tuple(cfg.INPUT.RRCROP_SCALE) == (0.5, 1.0) and cfg.DATALOADER.TRAIN_X.BATCH_SIZE == 16
    expected = "cls" if ("cross" in name or "dg" in name) else "fusion"
    assert cfg.TRAINER.DEAR.INFERENCE == expected


@pytest.mark.parametrize("role_map, strategy, core_heads", [
    ("tiny_synthetic.yaml", "role",
     {(4, 0): "location", (4, 1): "color", (4, 2): "color", (5, 1): "shape", (6, 2): "size"}),
    ("tiny_synthetic_discovered.yaml", "role", {(4, 2): "color", (6, 2): "shape"}),
    ("tiny_synthetic_discovered.yaml", "random_shuffle", {(5, 0): "shape", (5, 1): "color"}),
])
def test_synthetic_config_with_the_tiny_clips_role_maps(role_map, strategy, core_heads, monkeypatch):
    from trainers.dear import check_dear_config, deep_head_roles
    from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file

    monkeypatch.chdir(ROOT)  # the config names the tiny CLIP and the role maps relative to the repository
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, "configs/trainers/DeAR/synthetic.yaml")
    node = cfg.TRAINER.DEAR
    node.ROLE_MAP, node.MASK_STRATEGY = f"configs/head_roles/{role_map}", strategy
    check_dear_config(node)
    assert cfg.MODEL.BACKBONE.NAME == "configs/clip/tiny-synthetic-clip.json" and node.INJECT_LAYER == 4
    roles = deep_head_roles(node, 6, 4)
    cores = {(layer, head): role.core_attribute(node.ATTRIBUTES)
             for layer, heads in roles.items() for head, role in enumerate(heads)}
    found = {key: attribute for key, attribute in cores.items() if attribute}
    assert sorted(roles) == [4, 5, 6] and found == core_heads
