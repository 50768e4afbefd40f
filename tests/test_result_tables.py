"""Paper tables of tools/parse_results.py --protocol on hand-written run folders.

Every expected number below is computed by hand in the comments (population std,
HM of the seed means, Average = HM of the averaged Base and Novel).
"""
import csv
import io
import json
from pathlib import Path

import pytest

from vlprompt_app.protocols.published import PublishedError, load_published
from vlprompt_app.protocols.tables import Cell, Measurements, format_cell, harmonic_mean, method_groups

ROOT = Path(__file__).resolve().parents[1]

from vlprompt_app.commands import parse_results

EVAL_LOG = ("Loading trainer: CoOp\nEvaluate on the *test* set\n=> result\n* total: 100\n"
            "* correct: 54\n* accuracy: {acc:.1f}%\n* error: {err:.1f}%\n* macro_f1: 50.0%\n")


def write_result(folder: Path, accuracy: float):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"completed": True, "metrics": {"accuracy": accuracy}}))


# dataset -> trainer -> (Base of seeds 1-3, Novel of seeds 1-3); None = missing run
B2N = {
    "dtd": {"CoOp": ((80.0, 81.0, 82.0), (50.0, 52.0, 54.0)),
            "DeAR": ((83.0, 84.0, 85.0), (70.0, 71.0, 72.0))},
    "eurosat": {"CoOp": ((90.0, 90.0, 93.0), (60.0, 63.0, 60.0)),
                "DeAR": ((95.0, 96.0, 97.0), (80.0, 84.0, None))},
}
CFG = {"CoOp": "vit_b16_ctxv1", "DeAR": "vit_b16"}


@pytest.fixture
def b2n_root(tmp_path):
    b2n = tmp_path / "base2new"
    for dataset, methods in B2N.items():
        for trainer, (base, novel) in methods.items():
            tail = Path(dataset, "shots_16", trainer, CFG[trainer])
            for seed, (b, n) in enumerate(zip(base, novel), start=1):
                write_result(b2n / "train_base" / tail / f"seed{seed}", b)
                if n is None:
                    continue
                folder = b2n / "test_new" / tail / f"seed{seed}"
                if (dataset, trainer, seed) == ("dtd", "CoOp", 3):  # a log of other CoOp-family code
                    folder.mkdir(parents=True)
                    (folder / "log.txt").write_text(EVAL_LOG.format(acc=n, err=100 - n))
                else:
                    write_result(folder, n)
    crashed = b2n / "test_new" / "dtd" / "shots_16" / "CoOp" / CFG["CoOp"] / "seed4"
    crashed.mkdir()
    (crashed / "log.txt").write_text("Loading trainer: CoOp\n")  # died before its result
    return tmp_path


def cli(capsys, *argv):
    assert parse_results.main([str(a) for a in argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def pipe_rows(text):
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|") and not set(line) <= set("|-: "))}


# Hand computations (population std):
# CoOp dtd     B 81.00 ± sqrt(2/3)=0.82   N 52.00 ± sqrt(8/3)=1.63   HM 2*81*52/133 = 63.34
# CoOp eurosat B 91.00 ± sqrt(2)=1.41     N 61.00 ± sqrt(2)=1.41     HM 2*91*61/152 = 73.04
# CoOp Average B 86.00 (per seed 85, 85.5, 87.5 -> std sqrt(3.5/3)=1.08)
#              N 56.50 (per seed 55, 57.5, 57 -> std 1.08)            HM 2*86*56.5/142.5 = 68.20
# DeAR dtd     B 84.00 ± 0.82  N 71.00 ± 0.82  HM 2*84*71/155 = 76.95
# DeAR eurosat B 96.00 ± 0.82  N 82.00 ± 2.00 [2/3] (seed 3 missing)  HM 2*96*82/178 = 88.45†
# DeAR Average B 90.00 ± 0.82 (per seed 89, 90, 91)  N 76.50† (no ±: a seed is missing)
#              HM 2*90*76.5/166.5 = 82.70†
EXPECTED_B2N = {
    "dtd": ["81.00 ± 0.82", "52.00 ± 1.63", "63.34", "84.00 ± 0.82", "71.00 ± 0.82", "76.95"],
    "eurosat": ["91.00 ± 1.41", "61.00 ± 1.41", "73.04", "96.00 ± 0.82", "82.00 ± 2.00 [2/3]", "88.45†"],
    "Average": ["86.00 ± 1.08", "56.50 ± 1.08", "68.20", "90.00 ± 0.82", "76.50†", "82.70†"],
}


def test_base2new_terminal_and_markdown_show_hand_computed_values(b2n_root, capsys):
    out, err = cli(capsys, b2n_root, "--protocol", "base2new", "--seeds", "1", "2", "3")
    rows = pipe_rows(out)
    assert rows["Dataset"] == ["CoOp Base", "CoOp Novel", "CoOp HM", "DeAR Base", "DeAR Novel", "DeAR HM"]
    assert {k: rows[k] for k in EXPECTED_B2N} == EXPECTED_B2N
    assert "mean ± std (population) over seeds 1, 2, 3" in out
    assert "missing seeds: eurosat / DeAR Novel: 3" in out
    assert "seed4: log.txt has no end signal" not in err  # seed 4 is not an expected seed

    out, _ = cli(capsys, b2n_root / "base2new", "--protocol", "base2new", "--format", "markdown",
                 "--trainers", "DeAR,CoOp")
    assert out.startswith("### Base-to-novel generalization")
    rows = pipe_rows(out)
    assert rows["Dataset"][:3] == ["DeAR Base", "DeAR Novel", "DeAR HM"]
    assert rows["Average"] == EXPECTED_B2N["Average"][3:] + EXPECTED_B2N["Average"][:3]
    assert "- missing seeds: eurosat / DeAR Novel: 3" in out


def test_base2new_seed_set_defaults_to_every_seed_found(b2n_root, capsys):
    out, err = cli(capsys, b2n_root, "--protocol", "base2new", "--trainers", "CoOp")
    assert "seed4: " in err and "Incomplete runs (excluded)" in err  # the crashed folder is listed
    assert pipe_rows(out)["dtd"] == EXPECTED_B2N["dtd"][:3]


def test_base2new_latex_and_csv(b2n_root, capsys):
    out, _ = cli(capsys, b2n_root, "--protocol", "base2new", "--format", "latex", "--seeds", "1", "2", "3")
    assert r"\begin{tabular}{lcccccc}" in out
    assert r" & \multicolumn{3}{c}{CoOp} & \multicolumn{3}{c}{DeAR} \\" in out
    assert r"\cmidrule(lr){2-4} \cmidrule(lr){5-7}" in out
    assert (r"eurosat & 91.00 $\pm$ 1.41 & 61.00 $\pm$ 1.41 & 73.04 & 96.00 $\pm$ 0.82 & "
            r"82.00 $\pm$ 2.00 [2/3] & 88.45$^\dagger$ \\") in out
    assert r"\midrule" + "\n" + r"Average & 86.00 $\pm$ 1.08 & 56.50 $\pm$ 1.08 & 68.20 & " in out
    assert "% missing seeds: eurosat / DeAR Novel: 3" in out

    out, _ = cli(capsys, b2n_root, "--protocol", "base2new", "--format", "csv", "--seeds", "1", "2", "3")
    records = {(r["row"], r["method"], r["column"]): r for r in csv.DictReader(io.StringIO(out))}
    assert len(records) == 3 * 6
    coop_dtd_base = records[("dtd", "CoOp", "Base")]
    assert (coop_dtd_base["mean"], coop_dtd_base["std"], coop_dtd_base["n_seeds"]) == ("81.0000", "0.8165", "3")
    partial = records[("eurosat", "DeAR", "Novel")]
    assert (partial["mean"], partial["std"], partial["n_seeds"], partial["expected_seeds"],
            partial["missing_seeds"]) == ("82.0000", "2.0000", "2", "3", "3")
    assert records[("Average", "DeAR", "HM")]["mean"] == f"{13770 / 166.5:.4f}"
    assert records[("Average", "DeAR", "HM")]["flagged"] == "1"
    assert records[("Average", "CoOp", "Base")]["std"] == f"{(3.5 / 3) ** 0.5:.4f}"


def test_published_columns_and_delta(b2n_root, tmp_path, capsys):
    published = tmp_path / "pub.yaml"
    published.write_text("protocol: base2new\nmethods:\n  DeAR:\n    source: a paper, Table 2\n"
                         "    values:\n      dtd: [85.0, 70.5, 76.8]\n      average: [85.94, 79.73, 82.72]\n")
    out, _ = cli(capsys, b2n_root, "--protocol", "base2new", "--published", published,
                 "--seeds", "1", "2", "3")
    rows = pipe_rows(out)
    assert rows["Dataset"][3:] == ["DeAR Base", "DeAR Base pub.", "DeAR ΔBase", "DeAR Novel",
                                   "DeAR Novel pub.", "DeAR ΔNovel", "DeAR HM", "DeAR HM pub.", "DeAR ΔHM"]
    # dtd: 84.00 - 85.0 = -1.00; 71.00 - 70.5 = +0.50; 76.95 - 76.8 = +0.15
    assert rows["dtd"][3:] == ["84.00 ± 0.82", "85.00", "-1.00", "71.00 ± 0.82", "70.50", "+0.50",
                               "76.95", "76.80", "+0.15"]
    assert rows["eurosat"][4:6] == ["-", "-"]
    # Average: 90.00 - 85.94 = +4.06; 76.50† - 79.73 = -3.23†; 82.70† - 82.72 = -0.02†; all marked
    # † because the published rows (dtd) are not the table's datasets (dtd, eurosat)
    assert rows["Average"][3:] == ["90.00 ± 0.82", "85.94", "+4.06†", "76.50†", "79.73", "-3.23†",
                                   "82.70†", "82.72", "-0.02†"]
    assert "DeAR: the published Average is over other datasets than this table's" in out
    assert "published DeAR: a paper, Table 2" in out


def test_published_alone_prints_the_papers_base2new_table(tmp_path, capsys):
    """No run at all: --published prints the picked methods' published columns over the
    benchmark's datasets, in the order of --trainers (MMRL's values: DeAR paper, Table 2)."""
    out, err = cli(capsys, tmp_path, "--protocol", "base2new", "--published", "--trainers", "MMRL,CoOp")
    assert "no completed base2new run" in err and "the published numbers alone follow" in err
    rows = pipe_rows(out)
    assert rows["Dataset"] == ["MMRL Base pub.", "MMRL Novel pub.", "MMRL HM pub.",
                               "CoOp Base pub.", "CoOp Novel pub.", "CoOp HM pub."]
    assert list(rows)[1:] == ["imagenet", "caltech101", "oxford_pets", "stanford_cars", "oxford_flowers",
                              "food101", "fgvc_aircraft", "sun397", "dtd", "eurosat", "ucf101", "Average"]
    assert rows["Average"] == ["85.68", "77.16", "81.20", "82.69", "63.22", "71.66"]
    assert rows["imagenet"][:3] == ["77.90", "71.30", "74.45"]
    assert "published MMRL: MMRL (CVPR2025) row of DeAR (CVPR 2026) Table 2" in out


def test_published_methods_without_runs_follow_the_measured_ones(b2n_root, tmp_path, capsys):
    published = tmp_path / "pub.yaml"
    published.write_text("protocol: base2new\nmethods:\n  DeAR:\n    source: a\n    values:\n"
                         "      dtd: [85.0, 70.5, 76.8]\n"
                         "  MMRL:\n    source: b\n    values:\n      dtd: [85.67, 65.0, 73.82]\n"
                         "      imagenet: [77.9, 71.3, 74.45]\n      average: [85.68, 77.16, 81.2]\n"
                         "  TCP:\n    source: c\n    values:\n      dtd: [82.77, 58.07, 68.25]\n")
    out, _ = cli(capsys, b2n_root, "--protocol", "base2new", "--published", published, "--seeds", "1", "2", "3",
                 "--trainers", "CoOp,DeAR,MMRL")
    rows = pipe_rows(out)
    assert rows["Dataset"][-3:] == ["MMRL Base pub.", "MMRL Novel pub.", "MMRL HM pub."]
    assert not any(title.startswith("TCP") for title in rows["Dataset"])  # not picked by --trainers
    # the published imagenet row joins the table's datasets (a benchmark dataset), ours there are -
    assert list(rows)[1:] == ["imagenet", "dtd", "eurosat", "Average"]
    assert rows["imagenet"][:3] == ["-", "-", "-"] and rows["imagenet"][-3:] == ["77.90", "71.30", "74.45"]
    assert rows["dtd"][:3] == EXPECTED_B2N["dtd"][:3] and rows["dtd"][-3:] == ["85.67", "65.00", "73.82"]
    assert rows["eurosat"][-3:] == ["-", "-", "-"]
    assert rows["Average"][-3:] == ["85.68", "77.16", "81.20"]


def test_published_rows_of_methods_without_runs_in_transfer_tables(tmp_path, capsys):
    out, _ = cli(capsys, tmp_path, "--protocol", "cross_dataset", "dg", "--published", "--trainers", "MMRL")
    xd, dg = out.split("Domain generalization")
    # MMRL (DeAR paper Tables 3-4): ImageNet source 72.03, target Average 67.25; DG V2 64.47 ... avg 60.59
    assert pipe_rows(xd)["MMRL (published)"][0] == "72.03" and pipe_rows(xd)["MMRL (published)"][-1] == "67.25"
    assert pipe_rows(dg)["MMRL (published)"][1:] == ["64.47", "49.17", "51.20", "77.53", "60.59"]
    assert "DeAR (published)" not in pipe_rows(xd)


# ----------------------------------------------------------------- other protocols


def test_fewshot_table_per_shot_with_zero_shot_column(tmp_path, capsys):
    values = {("CoOp", "vit_b16", 1): {"dtd": (40.0, 44.0), "eurosat": (60.0, 62.0)},
              ("CoOp", "vit_b16", 16): {"dtd": (60.0, 61.0), "eurosat": (80.0, 82.0)},
              ("ZeroshotCLIP", "vit_b16", 0): {"dtd": (44.0, 44.0), "eurosat": (48.0, 48.0)}}
    for (trainer, cfg, shots), per_dataset in values.items():
        for dataset, accs in per_dataset.items():
            for seed, acc in enumerate(accs, start=1):
                write_result(tmp_path / dataset / trainer / f"{cfg}_{shots}shots" / f"seed{seed}", acc)
    write_result(tmp_path / "evaluation" / "CoOp" / "vit_b16_16shots" / "dtd" / "seed1", 10.0)  # not few-shot
    out, err = cli(capsys, tmp_path, "--protocol", "fewshot", "--published")
    assert "note: there are no published numbers for fewshot" in err
    rows = pipe_rows(out)
    assert rows["Dataset"] == ["CoOp 1-shot", "CoOp 16-shot", "ZeroshotCLIP 0-shot"]
    # dtd 1-shot: 42 ± 2; 16-shot 60.5 ± 0.5; Average 1-shot (42+61)/2 = 51.5, per seed 50, 53 -> ± 1.5;
    # Average 16-shot (60.5+81)/2 = 70.75, per seed 70, 71.5 -> ± 0.75
    assert rows["dtd"] == ["42.00 ± 2.00", "60.50 ± 0.50", "44.00 ± 0.00"]
    assert rows["Average"] == ["51.50 ± 1.50", "70.75 ± 0.75", "46.00 ± 0.00"]


def test_cross_dataset_and_dg_tables_with_published_rows(tmp_path, capsys):
    for seed, (source, caltech, dtd, v2) in enumerate([(71.0, 93.0, 45.0, 64.0), (72.0, 95.0, 46.0, 65.0)], 1):
        write_result(tmp_path / "imagenet" / "DeAR" / "vit_b16_16shots" / f"seed{seed}", source)
        for dataset, acc in (("caltech101", caltech), ("dtd", dtd), ("imagenetv2", v2)):
            write_result(tmp_path / "evaluation" / "DeAR" / "vit_b16_16shots" / dataset / f"seed{seed}", acc)
    out, _ = cli(capsys, tmp_path, "--protocol", "cross_dataset", "dg", "--published")
    xd, dg = out.split("Domain generalization")
    rows = pipe_rows(xd)
    # targets present: caltech101 94 ± 1, dtd 45.5 ± 0.5; Average (94+45.5)/2 = 69.75 flagged (8 targets missing)
    assert rows["Method"][:3] == ["imagenet (source)", "caltech101", "oxford_pets"]
    assert rows["DeAR"][:2] == ["71.50 ± 0.50", "94.00 ± 1.00"]
    assert rows["DeAR"][8] == "45.50 ± 0.50" and rows["DeAR"][-1] == "69.75†"
    # published (DeAR paper Table 3): ImageNet 71.50, Caltech101 95.00 -> Δ +0.00, -1.00
    assert rows["DeAR (published)"][:2] == ["71.50", "95.00"]
    assert rows["DeAR Δ"][:2] == ["+0.00", "-1.00"]
    rows = pipe_rows(dg)
    assert rows["Method"] == ["imagenet (source)", "imagenetv2", "imagenet_sketch", "imagenet_a",
                              "imagenet_r", "Average"]
    assert rows["DeAR"][:3] == ["71.50 ± 0.50", "64.50 ± 0.50", "-"]
    assert rows["DeAR Δ"][1] == "-0.37"  # 64.50 - 64.87


# ---------------------------------------------------------------- building blocks


def test_cells_and_methods_with_several_configs():
    cell = Cell.measured({"2": 80.0, "1": 81.0}, ["1", "2", "3"])
    assert cell.values == (("1", 81.0), ("2", 80.0)) and cell.missing_seeds == ("3",)
    assert format_cell(cell) == "80.50 ± 0.50 [2/3]"
    assert format_cell(Cell(-0.004, signed=True)) == "-0.00" and format_cell(Cell()) == "-"
    assert harmonic_mean(80.0, 60.0) == pytest.approx(9600 / 140)

    meas = Measurements()
    for seed in "12":
        meas.add("CoOp", "vit_b16_ctxv1", "dtd", "Base", seed, 80.0)
        meas.add("CoOp", "vit_b16_ep50_ctxv1", "imagenet", "Base", seed, 70.0)  # disjoint: one method
        meas.add("MaPLe", "a", "dtd", "Base", seed, 81.0)
        meas.add("MaPLe", "b", "dtd", "Base", seed, 82.0)  # same dataset: two methods

    groups = method_groups(meas)
    assert [g.label for g in groups] == ["CoOp", "MaPLe (a)", "MaPLe (b)"]
    assert groups[0].config_note() == "CoOp ran with configs vit_b16_ctxv1 (dtd); vit_b16_ep50_ctxv1 (imagenet)."
    assert [g.label for g in method_groups(meas, ["MaPLe:b", "CoOp"])] == ["MaPLe", "CoOp"]  # one config left


def test_shipped_published_numbers_are_consistent():
    """Every HM of the baselines' per-dataset rows (configs/published/) is 2BN/(B+N) to 0.01
    and their column means reproduce the published averages to 0.015."""
    base2new = load_published(ROOT / "configs" / "published" / "base2new.yaml", "base2new")
    for method in ("ZeroshotCLIP", "CoOp", "CoCoOp", "KgCoOp", "MaPLe", "PromptSRC", "RAda"):
        rows = {k: v for k, v in base2new[method].values.items() if k != "average"}
        assert len(rows) == 11, method
        for dataset, v in rows.items():
            assert harmonic_mean(v["Base"], v["Novel"]) == pytest.approx(v["HM"], abs=0.011), (method, dataset)
        for column in ("Base", "Novel"):
            mean = sum(v[column] for v in rows.values()) / 11
            assert mean == pytest.approx(base2new[method].values["average"][column], abs=0.015), (method, column)
    assert base2new["DeAR"].get("average", "HM") == 82.72
    for protocol, n_targets in (("cross_dataset", 10), ("dg", 4)):
        published = load_published(ROOT / "configs" / "published" / f"{protocol}.yaml", protocol)
        for method, entry in published.items():
            targets = [v[""] for k, v in entry.values.items() if k not in ("imagenet", "average")]
            assert len(targets) == n_targets, (protocol, method)
            assert sum(targets) / n_targets == pytest.approx(entry.get("average"), abs=0.011), (protocol, method)


def test_bad_published_file_and_missing_protocol_data(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("protocol: base2new\nmethods:\n  CoOp:\n    source: x\n    values: {dtd: [1, 2]}\n")
    with pytest.raises(PublishedError, match=r"methods.CoOp.values.dtd must be \[Base, Novel, HM\]"):
        load_published(bad, "base2new")
    with pytest.raises(PublishedError, match="are for the protocol 'base2new', not 'dg'"):
        load_published(bad, "dg")
    write_result(tmp_path / "run" / "dtd" / "CoOp" / "c_4shots" / "seed1", 50.0)
    assert parse_results.main([str(tmp_path / "run"), "--protocol", "base2new"]) == 1
    assert "No completed run of base2new" in capsys.readouterr().err
    assert parse_results.main([str(tmp_path / "run"), "--protocol", "base2new", "--published", str(bad),
                    "--benchmark", "nope"]) == 2
    assert "Benchmark file" in capsys.readouterr().err
