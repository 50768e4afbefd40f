"""The committed tiny CLIP and the synthetic benchmark's learning-behaviour check (CI).

The CoOp test is the regression test of the project's learning behaviour: with the
committed checkpoint, a short CoOp run on the synthetic main set must beat zero-shot
CLIP on the base classes by a clear margin; a change that silently stops learning fails
it. Measured with the committed checkpoint: zero-shot 55.6 % on the base classes; this
3-epoch CoOp run reached 76.5, 77.2, 78.4, 77.8 and 78.5 % with seeds 1-5 (gains of
20.9 to 22.9 points), so MARGIN = 10 points (the acceptance figure) leaves about half the
gain as headroom.
"""
import json
import os

import pytest
import torch

from vlprompt_app.commands import train
from vlprompt.clip import CLIPLoadError, CLIPRunner, load_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "clip", "tiny-synthetic-clip.json")
WEIGHTS = os.path.join(ROOT, "weights", "tiny-synthetic-clip.pt")
SYNTHETIC_CFG = "configs/trainers/CoOp/synthetic.yaml"
# Smallest CoOp gain over zero-shot (base accuracy, points) this short run must show.
MARGIN = 10.0


def test_committed_tiny_clip_loads_like_any_local_clip_file():
    model, info = load_clip(CONFIG, WEIGHTS)
    runner = CLIPRunner(model)
    assert info["weights"] == WEIGHTS and info["model_name"] == "tiny-synthetic-clip"
    assert (runner.visual.num_layers, runner.visual.num_heads) == (6, 16)
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    assert os.path.getsize(WEIGHTS) <= 15 * 2 ** 20
    stored = torch.load(WEIGHTS, map_location="cpu", weights_only=True)["state_dict"]
    torch.testing.assert_close(model.state_dict()["visual.proj"], stored["visual.proj"].float())


def test_hand_made_role_map_fits_the_tiny_clip():
    from vlprompt.clip.head_roles import load_role_map

    role_map = load_role_map(os.path.join(ROOT, "configs", "head_roles", "tiny_synthetic.yaml"))
    role_map.check_backbone(6, 16)
    role_map.check_inject_layer(4)
    assert sorted(role_map.roles) == [4, 5, 6]


def test_corrupt_or_truncated_checkpoint_gives_a_clear_error(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(open(WEIGHTS, "rb").read()[: os.path.getsize(WEIGHTS) // 2])
    for path in (garbage, truncated):
        with pytest.raises(CLIPLoadError, match=r'Cannot load CLIP weights from ".*\.pt" into backbone'):
            load_clip(CONFIG, str(path))


def test_checkpoint_of_another_architecture_names_both(tmp_path, tiny_clip_files):
    _, other_weights = tiny_clip_files
    with pytest.raises(CLIPLoadError, match="tiny-synthetic-clip.*whose tensors match that backbone"):
        load_clip(CONFIG, other_weights)


def test_missing_checkpoint_or_config_is_named(tmp_path):
    with pytest.raises(CLIPLoadError, match=r'"weights/missing\.pt" \(MODEL.BACKBONE.WEIGHTS\) does not exist'):
        load_clip(CONFIG, "weights/missing.pt")
    with pytest.raises(CLIPLoadError, match=r"Model config file .*nowhere\.json.* does not exist"):
        load_clip(str(tmp_path / "nowhere.json"), WEIGHTS)


def run_base(root, output_dir, trainer, flags=(), opts=()):
    """Base-class accuracy (%) of one train.py run on the synthetic main set, 16 shots, seed 1."""
    status = train.run([
        "--root", str(root), "--trainer", trainer, "--seed", "1", *flags,
        "--dataset-config-file", "configs/datasets/synthetic_shapes.yaml",
        "--config-file", SYNTHETIC_CFG, "--output-dir", str(output_dir),
        "DATASET.NUM_SHOTS", "16", "DATASET.SUBSAMPLE_CLASSES", "base", *opts,
    ])
    assert status == 0
    return json.loads((output_dir / "results.json").read_text())["metrics"]["accuracy"]


@pytest.mark.e2e
def test_coop_learns_beyond_zero_shot_on_the_synthetic_base_classes(tmp_path, monkeypatch, synthetic_data):
    monkeypatch.chdir(ROOT)
    zero_shot = run_base(synthetic_data, tmp_path / "zs", "ZeroshotCLIP", flags=["--eval-only"])
    coop = run_base(synthetic_data, tmp_path / "coop", "CoOp", opts=["OPTIM.MAX_EPOCH", "3"])
    assert 25.0 <= zero_shot <= 85.0
    assert coop >= zero_shot + MARGIN, f"CoOp {coop:.1f}% vs zero-shot {zero_shot:.1f}%"
