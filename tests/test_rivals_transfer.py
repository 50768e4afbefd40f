"""Cross-dataset and domain-generalization runs of MMRL and DePT, whose inference depends on the
evaluation scope.

MMRL (configs/trainers/MMRL/vit_b16_cross_datasets.yaml) scores the source with the fusion of both
paths and every target with the class-token path z_c only; DePT (vit_b16_maple.yaml) fuses the
linear head on the source and on a target whose classes are among the source's (the head's rows of
those classes: ImageNet-A's subset) and uses the similarity logits only on a target with other
classes (EuroSAT, and the miniature ImageNet-V2, whose 12 classes are named "class i"). The
end-to-end test runs tools/run_protocol.py in-process on miniature ImageNet, EuroSAT, ImageNet-V2
and ImageNet-A trees with a tiny random CLIP: each evaluation gets its role (source, target), each
rule is resolved in the log, and every target loads the ImageNet model (EuroSAT would get a
2048-dimensional representation from MMRL's per-dataset table, which the official test script
overrides, as the config does).
"""
import json
from pathlib import Path

import pytest
import yaml

from mini_datasets import write_eurosat, write_imagenet, write_imagenet_a, write_imagenetv2
from trainers.mmrl import check_mmrl_config, dataset_settings
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file
from vlprompt.testing import write_tiny_clip

ROOT = Path(__file__).resolve().parents[1]

from vlprompt_app.commands import run_protocol

MMRL_CROSS = ROOT / "configs/trainers/MMRL/vit_b16_cross_datasets.yaml"
MMRL_BASE2NEW = ROOT / "configs/trainers/MMRL/vit_b16.yaml"


def merged(trainer_config, dataset_stem):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, str(ROOT / "configs/datasets" / f"{dataset_stem}.yaml"))
    merge_from_file(cfg, str(trainer_config))
    return cfg


def paper_transfer_datasets():
    """The source and every target of the paper benchmark's cross_dataset and dg protocols."""
    benchmark = yaml.safe_load((ROOT / "configs/benchmarks/paper.yaml").read_text())
    stems = {benchmark[protocol]["source"] for protocol in ("cross_dataset", "dg")}
    for protocol in ("cross_dataset", "dg"):
        stems.update(benchmark[protocol]["targets"])
    return sorted(stems)


@pytest.mark.parametrize("stem", paper_transfer_datasets())
def test_mmrl_cross_config_fixes_lambda_and_rep_dim_on_every_transfer_dataset(stem):
    cfg = merged(MMRL_CROSS, stem)
    node, name = cfg.TRAINER.MMRL, cfg.DATASET.NAME
    check_mmrl_config(node, name)  # the ImageNet variants are outside the per-dataset table
    assert dataset_settings(node, name) == (512, 0.2)
    assert (cfg.OPTIM.MAX_EPOCH, cfg.OPTIM.WARMUP_EPOCH, cfg.DATALOADER.TRAIN_X.BATCH_SIZE) == (1, 0, 32)


def test_the_base2new_config_would_not_serve_the_transfer_targets():
    """Why the cross-dataset config sets λ and REP_DIM: the table would reshape EuroSAT's model
    (2048) and has no entry for the ImageNet variants."""
    eurosat = merged(MMRL_BASE2NEW, "eurosat")
    assert dataset_settings(eurosat.TRAINER.MMRL, eurosat.DATASET.NAME) == (2048, 0.01)
    variant = merged(MMRL_BASE2NEW, "imagenetv2")
    with pytest.raises(ConfigError, match="TRAINER.MMRL.REG_WEIGHT is 'auto'.*no entry for 'ImageNetV2'.*"
                                          "set TRAINER.MMRL.REG_WEIGHT"):
        check_mmrl_config(variant.TRAINER.MMRL, variant.DATASET.NAME)


@pytest.fixture(scope="module")
def transfer_world(tmp_path_factory):
    """(data root, benchmark YAML, tiny CLIP config, weights): ImageNet source, EuroSAT cross-dataset
    target, ImageNet-V2 and ImageNet-A domain-generalization targets."""
    base = tmp_path_factory.mktemp("rivals_transfer")
    data = base / "data"
    for write in (write_imagenet, write_eurosat, write_imagenetv2, write_imagenet_a):
        write(str(data))
    benchmark = base / "transfer.yaml"
    benchmark.write_text(yaml.safe_dump({
        "seeds": [1],
        "cross_dataset": {"source": "imagenet", "targets": ["eurosat"], "shots": 2},
        "dg": {"source": "imagenet", "targets": ["imagenetv2", "imagenet_a"], "shots": 2},
    }))
    config, weights = write_tiny_clip(str(base), name="tiny-clip-rivals-transfer")
    return data, benchmark, config, weights


RULES = {  # trainer: (config, log line of the source, log line of a target)
    "MMRL": ("vit_b16_cross_datasets", "TRAINER.MMRL.INFERENCE: fusion (auto for the source scope)",
             "TRAINER.MMRL.INFERENCE: cls (auto for the target scope)"),
    "DePT": ("vit_b16_maple", "TRAINER.DEPT.INFERENCE: fused (auto for the source scope)",
             "TRAINER.DEPT.INFERENCE: sim (auto for the target scope)"),
}

LEARNERS = {"MMRL": "representation", "DePT": "DePT"}  # the registered (checkpointed) module of each
DEPT_TARGET_FUSION = {  # target: DePT's log line after loading the miniature ImageNet model (5 classes)
    "eurosat": "DePT target fusion: sim, 4 of the 4 classes of this dataset are not among the head's 5",
    "imagenetv2": "DePT target fusion: sim, 12 of the 12 classes of this dataset are not among the head's 5",
    "imagenet_a": "DePT target fusion: fused, the head's rows of this dataset's 3 classes (of its 5 training",
}


@pytest.mark.slow  # an in-process protocol grid: two trainings and six target evaluations
def test_protocol_runs_score_the_source_with_fusion_and_every_target_with_the_rule(transfer_world, tmp_path,
                                                                                     monkeypatch):
    data, benchmark, config, weights = transfer_world
    monkeypatch.chdir(ROOT)
    output = tmp_path / "out"
    status = run_protocol.main([
        "--benchmark", str(benchmark), "--protocol", "cross_dataset", "dg", "--root", str(data),
        "--output", str(output), "--in-process",
        "--trainers", *(f"{name}:{config_name}" for name, (config_name, _, _) in RULES.items()),
        "--opts", "MODEL.BACKBONE.NAME", config, "MODEL.BACKBONE.WEIGHTS", weights, "USE_CUDA", "False",
        "INPUT.SIZE", "(32, 32)", "DATALOADER.NUM_WORKERS", "0", "DATALOADER.TRAIN_X.BATCH_SIZE", "4",
        "OPTIM.MAX_EPOCH", "1", "TRAINER.MMRL.PREC", "fp32", "TRAINER.MMRL.REP_LAYERS", "[1, 2]",
        "TRAINER.DEPT.PREC", "fp32", "TRAINER.MAPLE.PROMPT_DEPTH", "2",
    ])
    assert status == 0
    for name, (config_name, source_line, target_line) in RULES.items():
        source = output / "imagenet" / name / f"{config_name}_2shots" / "seed1"
        record = json.loads((source / "results.json").read_text())
        assert record["completed"] and record["eval_role"] == "source" and record["dataset"] == "ImageNet"
        assert source_line in (source / "log.txt").read_text()
        for target, dataset, classes in (("eurosat", "EuroSAT", 4), ("imagenetv2", "ImageNetV2", 12),
                                         ("imagenet_a", "ImageNetA", 3)):
            run = output / "evaluation" / name / f"{config_name}_2shots" / target / "seed1"
            record = json.loads((run / "results.json").read_text())
            assert record["completed"] and record["eval_role"] == "target", (name, target)
            assert (record["dataset"], record["num_classes"]) == (dataset, classes)
            log = (run / "log.txt").read_text()
            assert "Evaluation scope: target" in log and target_line in log, (name, target)
            learner = LEARNERS[name]
            assert f'Loading weights to {learner} from "{source / learner}' in log  # the ImageNet model
            assert (name == "DePT") == (DEPT_TARGET_FUSION[target] in log), (name, target)
