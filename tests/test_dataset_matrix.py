"""A dataset's facts in one place: the dataset classes hold their own (template, description stem,
published sizes), the benchmark files the dataset lists, and every per-dataset table of a method
is a DatasetRule; tools/dataset_matrix.py resolves each rule for each dataset (rule resolution
only: no model is built)."""
import json
import sys

from vlprompt.data.datasets import DATASET_REGISTRY
from vlprompt.engine import TRAINER_REGISTRY
from vlprompt.engine.option_rules import AUTO
from vlprompt_app.commands import check_datasets, dataset_matrix
from vlprompt_app.protocols.benchmark import dataset_config_names, load_benchmark
from vlprompt_app.results import base2new_dataset_order

CONFIGS = dataset_matrix.CONFIGS
PAPER = ("imagenet", "caltech101", "oxford_pets", "stanford_cars", "oxford_flowers", "food101", "fgvc_aircraft",
         "sun397", "dtd", "eurosat", "ucf101", "imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r", "objectnet")
TABLE_METHODS = ["KgCoOp", "MMRL", "MMRLpp", "ProGrad", "ProVP", "PromptKD", "SkipTuning", "TCP"]


def test_dataset_lists_come_from_the_benchmark_files():
    paper = load_benchmark("paper", CONFIGS)
    assert paper.dataset_stems() == PAPER  # base2new's eleven, then dg's targets, then fft's objectnet
    assert load_benchmark("synthetic", CONFIGS).dataset_stems() == (
        "synthetic_shapes", "synthetic_patterns", "synthetic_shapes_v2", "synthetic_shapes_sketch")
    names = dataset_config_names(CONFIGS)
    assert names["dtd"] == "DescribableTextures" and names["imagenet_a"] == "ImageNetA"
    assert check_datasets.benchmark_datasets() == [names[stem] for stem in PAPER]
    assert base2new_dataset_order() == PAPER[:11] == paper.protocol("base2new").datasets
    datasets = dataset_matrix.project_datasets()
    assert datasets[:16] == [names[stem] for stem in PAPER] and datasets[16] == "SyntheticShapes"
    assert datasets[-2:] == ["ImageFolder", "SyntheticScenes"]  # named by no benchmark: by name


def test_a_dataset_class_carries_its_own_facts():
    facts = dataset_matrix.dataset_facts("FGVCAircraft")
    assert facts == dataset_matrix.DatasetFacts("FGVCAircraft", ("fgvc_aircraft",), "a photo of a {}, a type of aircraft.",
                                                "fgvc", (3334, 3333, 3333), ("paper",))
    assert dataset_matrix.dataset_facts("ImageNetA").published_sizes == (None, None, 7500)
    assert dataset_matrix.dataset_facts("SyntheticShapes").benchmarks == ("synthetic",)
    assert dataset_matrix.dataset_facts("ObjectNet").description_stem == ""  # no descriptions are published


def test_every_per_dataset_table_of_a_trainer_file_is_a_dataset_rule():
    """A dict keyed by dataset names in a trainer file is the table (or the rows) of one of its rules,
    and an option rule's key is under its trainer's node with a default in the config."""
    names = set(DATASET_REGISTRY.registered_names())
    rules = dataset_matrix.method_rules()
    for method, declared in rules.items():
        module = sys.modules[TRAINER_REGISTRY.get(method).__module__]
        for attribute, value in vars(module).items():
            if isinstance(value, dict) and value and set(value) <= names:
                assert any(set(rule.table) == set(value) for rule in declared), f"{module.__name__}.{attribute}"
        for rule in declared:
            if rule.option:
                assert rule.key.startswith(f"TRAINER.{method.upper()}."), rule.key
                assert dataset_matrix.default_value(rule) == AUTO, rule.key
    assert [method for method in rules if rules[method]] == TABLE_METHODS


def test_every_cell_resolves_or_refuses_with_a_reason():
    rules = dataset_matrix.method_rules()
    datasets = dataset_matrix.project_datasets()
    matrix = dataset_matrix.build_matrix(list(rules), datasets)
    assert list(matrix) == TABLE_METHODS
    for method, by_dataset in matrix.items():
        assert list(by_dataset) == datasets
        for dataset, cells in by_dataset.items():
            assert list(cells) == [dataset_matrix.rule_label(rule) for rule in rules[method]]
            for rule in rules[method]:
                cell = cells[dataset_matrix.rule_label(rule)]
                if cell.refused:  # names the key, the dataset, the table and what to do
                    assert cell.refusal.startswith(f"{rule.key} is 'auto': its value is read from {rule.source} "
                                                   f"by DATASET.NAME, which has no entry for {dataset!r}")
                    assert cell.refusal.endswith(f"set {rule.key} explicitly. {rule.hint}".strip())
                else:
                    assert cell.value not in (None, "", AUTO), (method, dataset, rule.key)
                    if "template" in rule.key.lower():
                        assert cell.value.count("{}") == 1, (method, dataset, cell.value)
    names = dataset_config_names(CONFIGS)
    for stem in PAPER[:11]:  # every table covers the base-to-novel datasets
        assert not any(cell.refused for by_dataset in matrix.values() for cell in by_dataset[names[stem]].values())
    assert matrix["MMRL"]["EuroSAT"]["TRAINER.MMRL.REP_DIM"].value == 2048
    assert matrix["MMRLpp"]["ImageNetA"]["TRAINER.MMRLPP.BETA [target]"].value == 0.8
    assert matrix["MMRLpp"]["ImageNetA"]["TRAINER.MMRLPP.BETA [base, new, source]"].refused
    assert matrix["ProGrad"]["OxfordPets"]["ProGrad's template"].value == "a type of pet, a photo of a {}."
    assert matrix["ProVP"]["ObjectNet"]["ProVP's template"].value == "a photo of a {}."  # its own
    assert matrix["KgCoOp"]["DescribableTextures"]["KgCoOp's knowledge template"].value == (
        "a photo of a {}, a type of texture.")
    assert matrix["KgCoOp"]["EuroSAT"]["KgCoOp's knowledge template"].value == "a centered satellite photo of {}."
    assert matrix["SkipTuning"]["Food101"]["TRAINER.SKIPTUNING.EPOCH_DIVISOR"].value == 4
    assert matrix["SkipTuning"]["SyntheticShapes"]["TRAINER.SKIPTUNING.TEMPLATE"].value == "a photo of a {}."
    assert matrix["TCP"]["SyntheticShapes"]["TRAINER.TCP.CONTEXT_TEMPLATE"].refused


def test_the_command_prints_and_writes_the_matrix(tmp_path, capsys):
    path = tmp_path / "matrix.json"
    assert dataset_matrix.main(["--methods", "mmrl", "CoOp", "--datasets", "eurosat", "ImageNetA",
                                "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "EuroSAT    eurosat     a centered satellite photo of {}.  eurosat         train 13,500, val 5,400" in out
    assert [line.split() for line in out.splitlines() if line.startswith(("EuroSAT ", "ImageNetA "))][2:4] == [
        ["EuroSAT", "ok"], ["ImageNetA", "refuses", "2"]]
    assert "  TRAINER.MMRL.REP_DIM refuses 1: ImageNetA\n    for ImageNetA: TRAINER.MMRL.REP_DIM is 'auto'" in out
    assert out.rstrip().endswith("No per-dataset table (no DatasetRule in their files): CoOp\n\nWrote " + str(path))
    written = json.loads(path.read_text())
    assert written["datasets"]["EuroSAT"]["published_sizes"] == [13500, 5400, 8100]
    assert written["methods"]["MMRL"]["EuroSAT"] == {"TRAINER.MMRL.REG_WEIGHT": {"value": 0.01},
                                                     "TRAINER.MMRL.REP_DIM": {"value": 2048}}
    assert "no entry for 'ImageNetA'" in written["methods"]["MMRL"]["ImageNetA"]["TRAINER.MMRL.REP_DIM"]["refusal"]
    assert written["methods_without_tables"] == ["CoOp"]


def test_unknown_names_exit_2_with_what_was_expected(tmp_path, capsys):
    assert dataset_matrix.main(["--json", str(tmp_path / "missing" / "matrix.json")]) == 2
    assert "matrix.json: its folder does not exist" in capsys.readouterr().err
    assert dataset_matrix.main(["--methods", "Mars"]) == 2
    assert "Unknown method(s) ['Mars']: expected some of ATPrompt, CLIPAdapter" in capsys.readouterr().err
    assert dataset_matrix.main(["--datasets", "eurosatt"]) == 2
    err = capsys.readouterr().err
    assert "Unknown dataset(s) ['eurosatt']: expected some of ImageNet, Caltech101" in err
    assert err.rstrip().endswith("or a YAML stem of configs/datasets/.")
