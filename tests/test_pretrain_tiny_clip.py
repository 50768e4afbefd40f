"""tools/pretrain_tiny_clip.py: a few steps write a checkpoint that loads like real CLIP weights."""
import os
import re

import pytest
import torch

from vlprompt.clip import load_clip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from vlprompt_app.commands import pretrain_tiny_clip


@pytest.mark.slow  # a pretraining run of the tool
def test_pretraining_writes_a_loadable_fp16_checkpoint_and_its_record(tmp_path, tiny_clip_files):
    config, _ = tiny_clip_files
    out = tmp_path / "weights" / "tiny.pt"
    pretrain_tiny_clip.main([
        "--model-config", config, "--out", str(out), "--seed", "3", "--steps", "3", "--batch-size", "8",
        "--workers", "0", "--threads", "1", "--log-every", "1", "--probe-every", "0", "--probe-images", "16",
    ])
    stored = torch.load(out, map_location="cpu", weights_only=True)["state_dict"]
    assert all(value.dtype == torch.float16 for value in stored.values() if value.is_floating_point())
    model, info = load_clip(config, str(out))
    assert info["weights"] == str(out)
    torch.testing.assert_close(model.state_dict()["visual.proj"], stored["visual.proj"].float())
    record = (tmp_path / "weights" / "tiny.txt").read_text()
    assert "--seed 3 --steps 3" in record and "seed: 3\n" in record and "sha256" in record
    # the thread variables of the environment (OMP_NUM_THREADS under xdist) precede the command
    assert re.search(r"^command: (?:[A-Z_]+=\S+ )*python \S*tools/pretrain_tiny_clip\.py --model-config ", record,
                     re.M), record
    # CPU time of the trainer and of the rendering workers (none here), so the cost reads right on a loaded machine.
    cpu = re.search(r"CPU time: [\d.]+ min for the training process and ([\d.]+) min for the rendering "
                    r"worker\(s\) \(([\d.]+) s per step", record)
    assert cpu and cpu.group(1) == "0.0" and float(cpu.group(2)) > 0, record
    assert re.search(r"load average [\d.]+ at the start and [\d.]+ at the end", record), record


def test_learning_rate_warms_up_then_decays_to_zero():
    args = pretrain_tiny_clip.build_parser().parse_args(["--out", "x.pt", "--steps", "100", "--lr", "1e-3"])
    rates = [pretrain_tiny_clip.learning_rate(step, args) for step in range(100)]
    assert rates[0] == 1e-3 / 3 and rates[2] == 1e-3  # 3 warm-up steps (3 % of 100)
    assert all(a >= b for a, b in zip(rates[2:], rates[3:])) and rates[-1] < 1e-6
