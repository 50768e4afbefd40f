"""tools/plot_results.py: few-shot curves and the DeAR fusion-weight heat map (PNG files)."""
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from vlprompt_app import results as parse_results
from vlprompt_app.commands import plot_results as plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_result(folder: Path, accuracy: float):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"completed": True, "metrics": {"accuracy": accuracy}}))


@pytest.fixture
def fewshot_root(tmp_path):
    runs = {("CoOp", 1): {"dtd": (40.0, 44.0), "eurosat": (60.0, 62.0)},
            ("CoOp", 4): {"dtd": (50.0, 52.0), "eurosat": (70.0, 70.0)},
            ("CoOp", 16): {"dtd": (60.0, 61.0)},  # eurosat 16-shot missing
            ("ZeroshotCLIP", 0): {"dtd": (44.0, 44.0), "eurosat": (48.0, 48.0)}}
    for (trainer, shots), per_dataset in runs.items():
        for dataset, accs in per_dataset.items():
            for seed, acc in enumerate(accs, start=1):
                write_result(tmp_path / dataset / trainer / f"cfg_{shots}shots" / f"seed{seed}", acc)
    return tmp_path


def test_fewshot_curves_values(fewshot_root):
    results = parse_results.collect_measurements(fewshot_root, "fewshot")
    panels = plots.fewshot_curves(results, order=("eurosat", "dtd"))
    assert list(panels) == ["eurosat", "dtd", "Average"]
    assert panels["dtd"]["CoOp"] == [(1, 42.0, 2.0), (4, 51.0, 1.0), (16, 60.5, 0.5)]
    assert panels["dtd"]["ZeroshotCLIP"] == [(0, 44.0, 0.0)]
    average = panels["Average"]["CoOp"]  # 16 shots lacks eurosat: no Average point
    assert [(k, m) for k, m, _ in average] == [(1, (42.0 + 61.0) / 2), (4, (51.0 + 70.0) / 2)]
    assert all(math.isnan(s) for _, _, s in average)


def test_fewshot_figure_files(fewshot_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figures"
    assert plots.main(["fewshot", str(fewshot_root), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["fewshot.png", "fewshot_average.png", "fewshot_dtd.png", "fewshot_eurosat.png"]
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) and p.stat().st_size > 5000 for p in out.iterdir())
    assert "Wrote " + str(out / "fewshot.png") in capsys.readouterr().out


def write_dear_checkpoint(run: Path, logits, epoch=2):
    folder = run / "prompt_learner"
    folder.mkdir(parents=True)
    torch.save({"state_dict": {"attr_tokens": torch.zeros(2, 1, 4), "fusion_logits": torch.tensor(logits)},
                "epoch": epoch}, folder / f"model.pth.tar-{epoch}")
    (run / "results.json").write_text('{"completed": true, "metrics": {"accuracy": 1.0}}')


def test_fusion_weights_are_softmax_means_over_seeds(tmp_path, capsys):
    tail = Path("shots_16", "DeAR", "vit_b16")
    base = tmp_path / "base2new" / "train_base"
    write_dear_checkpoint(base / "dtd" / tail / "seed1", [0.0, 0.0, math.log(2.0)])  # 1/4, 1/4, 1/2
    write_dear_checkpoint(base / "dtd" / tail / "seed2", [0.0, math.log(3.0), 0.0])  # 1/5, 3/5, 1/5
    write_dear_checkpoint(base / "eurosat" / tail / "seed1", [0.0, 0.0, 0.0])
    stale = base / "eurosat" / tail / "seed1" / "prompt_learner" / "model.pth.tar-1"  # an older epoch
    torch.save({"state_dict": {"fusion_logits": torch.tensor([9.0, 0.0, 0.0])}, "epoch": 1}, stale)
    weights = plots.fusion_weights(tmp_path)
    assert weights["dtd"] == pytest.approx([(0.25 + 0.2) / 2, (0.25 + 0.6) / 2, (0.5 + 0.2) / 2])
    assert weights["eurosat"] == pytest.approx([1 / 3] * 3)
    with pytest.raises(plots.PlotError, match="No checkpoint of a MaPLe training run"):
        plots.fusion_weights(tmp_path, trainer="MaPLe")

    pytest.importorskip("matplotlib")
    out = tmp_path / "figures"
    assert plots.main(["fusion", str(tmp_path), "--out", str(out), "--components", "CLS", "color", "shape"]) == 0
    printed = capsys.readouterr().out
    dtd_line = next(line for line in printed.splitlines() if line.startswith("dtd "))
    assert [float(x) for x in dtd_line.split()[1:]] == pytest.approx([0.225, 0.425, 0.35])
    assert (out / "fusion_weights.png").read_bytes().startswith(PNG_SIGNATURE)
    assert plots.main(["fusion", str(tmp_path), "--out", str(out)]) == 1  # 6 default names, 3 weights
    assert "The fusion weights have [3] entries but 6 component names" in capsys.readouterr().err


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plots.PlotError, match=r'pip install -e "\.\[plots\]"'):
        plots.pyplot()


def write_sweep(folder: Path, points):
    write_result(folder, points[0.5])
    (folder / "wiseft_alphas.json").write_text(json.dumps(
        {"points": [{"alpha": alpha, "accuracy": accuracy} for alpha, accuracy in points.items()]}))


def test_wiseft_curve_averages_seeds_and_targets(tmp_path, capsys):
    # synthetic benchmark's fft: source synthetic_shapes, targets synthetic_shapes_v2 and synthetic_shapes_sketch
    for seed, shift in ((1, 0.0), (2, 2.0)):
        write_sweep(tmp_path / "synthetic_shapes" / "WiSEFT" / "synthetic_0shots" / f"seed{seed}",
                    {0.0: 30.0 + shift, 0.5: 60.0 + shift, 1.0: 70.0 + shift})
        for target, ood in (("synthetic_shapes_v2", 40.0), ("synthetic_shapes_sketch", 20.0)):
            write_sweep(tmp_path / "evaluation" / "WiSEFT" / "synthetic_0shots" / target / f"seed{seed}",
                        {0.0: ood + shift, 0.5: ood + 10.0 + shift, 1.0: ood + 5.0 + shift})
    # a seed without its target evaluations is left out
    write_sweep(tmp_path / "synthetic_shapes" / "WiSEFT" / "synthetic_0shots" / "seed3", {0.0: 0.0, 0.5: 0.0, 1.0: 0.0})
    curves = plots.wiseft_curves(tmp_path, "synthetic_shapes", ("synthetic_shapes_v2", "synthetic_shapes_sketch"))
    assert curves == {"synthetic": [(0.0, 31.0, 31.0), (0.5, 61.0, 41.0), (1.0, 71.0, 36.0)]}
    with pytest.raises(plots.PlotError, match="No WiSEFT fft run"):
        plots.wiseft_curves(tmp_path, "synthetic_shapes", ("synthetic_patterns",))
    pytest.importorskip("matplotlib")
    out = tmp_path / "figures"
    assert plots.main(["wiseft", str(tmp_path), "--benchmark", "synthetic", "--out", str(out)]) == 0
    assert (out / "wiseft.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "  0.50   61.00   41.00" in capsys.readouterr().out
