"""Method options chosen by the run (vlprompt/engine/option_rules.py): DatasetRule's ``auto``,
explicit values and datasets outside the table, and the config merge that lets a number replace
``auto`` (and ``auto`` a number)."""
import pytest
from yacs.config import CfgNode

from vlprompt.config import ConfigError, merge_from_file, merge_from_list
from vlprompt.engine.option_rules import AUTO, DatasetRule

WEIGHTS = {"EuroSAT": 0.01, "OxfordPets": 0.2}


def test_auto_reads_the_table_by_dataset_name():
    rule = DatasetRule("TRAINER.X.WEIGHT", WEIGHTS, source="trainers.x.WEIGHTS")
    assert AUTO == "auto"
    assert rule.resolve("auto", "EuroSAT") == 0.01 and rule.resolve("auto", "OxfordPets") == 0.2
    assert rule.describe("auto", "EuroSAT") == "TRAINER.X.WEIGHT: 0.01 (auto: from trainers.x.WEIGHTS for EuroSAT)"


def test_an_explicit_value_wins_over_the_table():
    rule = DatasetRule("TRAINER.X.WEIGHT", WEIGHTS)
    assert rule.resolve(3.0, "EuroSAT") == 3.0 and rule.resolve(0, "Mars") == 0
    assert rule.describe(3.0, "EuroSAT") == "TRAINER.X.WEIGHT: 3.0 (set explicitly)"
    with pytest.raises(ConfigError, match=r"TRAINER.X.WEIGHT must be 'auto' \(read from its per-dataset table by "
                                          r"DATASET.NAME\) or a number, got 'heavy'"):
        rule.resolve("heavy", "EuroSAT")
    templates = DatasetRule("TRAINER.X.TEMPLATE", {"EuroSAT": "a satellite photo of {}."})
    assert templates.resolve("a photo of a {}.", "EuroSAT") == "a photo of a {}."


def test_a_dataset_missing_from_the_table_is_an_error_naming_key_dataset_and_known_datasets():
    rule = DatasetRule("TRAINER.X.WEIGHT", WEIGHTS, source="trainers.x.WEIGHTS", hint="It is λ, e.g. 0.5.")
    with pytest.raises(ConfigError, match=r"^TRAINER.X.WEIGHT is 'auto': its value is read from trainers.x.WEIGHTS "
                                          r"by DATASET.NAME, which has no entry for 'Mars' \(it has EuroSAT, "
                                          r"OxfordPets\); set TRAINER.X.WEIGHT explicitly. It is λ, e.g. 0.5.$"):
        rule.resolve("auto", "Mars")
    assert rule.resolve(0.5, "Mars") == 0.5  # an explicit value needs no entry


def test_the_declared_default_serves_datasets_missing_from_the_table():
    rule = DatasetRule("TRAINER.X.DIVISOR", {"ImageNet": 4}, default=1, source="trainers.x.DIVISORS")
    assert rule.resolve("auto", "ImageNet") == 4 and rule.resolve("auto", "Mars") == 1
    assert rule.describe("auto", "Mars") == (
        "TRAINER.X.DIVISOR: 1 (auto: the default of trainers.x.DIVISORS for Mars)")
    assert DatasetRule("TRAINER.X.NAME", {"A": "a"}, default=None).resolve("auto", "B") is None


def test_a_value_without_option_names_the_table_to_extend():
    rule = DatasetRule("X's template", {"EuroSAT": "a satellite photo of {}."}, source="trainers.x.TEMPLATES",
                       option=False)
    assert rule.lookup("EuroSAT") == "a satellite photo of {}."
    with pytest.raises(ConfigError, match=r"^X's template is read from trainers.x.TEMPLATES by DATASET.NAME, which "
                                          r"has no entry for 'Mars' \(it has EuroSAT\); add one there.$"):
        rule.lookup("Mars")


def test_a_fallback_gives_the_dataset_its_own_value_when_the_reader_passes_it():
    rule = DatasetRule("X's template", {"EuroSAT": "a satellite photo of {}."}, default="", option=False,
                       fallback="template", source="trainers.x.TEMPLATES")
    assert rule.lookup("Mars", own="a photo of a {}.") == "a photo of a {}."
    assert rule.lookup("Mars") == ""  # the reader fills the dataset's own in later
    assert rule.lookup("EuroSAT", own="a photo of a {}.") == "a satellite photo of {}."  # the table wins
    assert rule.describe(AUTO, "Mars", own="a photo of a {}.") == (
        "X's template: 'a photo of a {}.' (Mars's own template; trainers.x.TEMPLATES has no entry for it)")
    assert DatasetRule("TRAINER.X.T", {}, default="", fallback="template").describe("auto", "Mars", "{}.") == (
        "TRAINER.X.T: '{}.' (auto: Mars's own template; its per-dataset table has no entry for it)")
    with pytest.raises(ValueError, match="a fallback .'template'. needs a default"):
        DatasetRule("X", {}, fallback="template")


def test_scopes_are_evaluation_scopes_in_their_order():
    assert DatasetRule("TRAINER.X.B", {}, scopes=("target", "base")).scopes == ("base", "target")
    assert DatasetRule("TRAINER.X.B", {}).scopes == ("base", "new", "source", "target")
    with pytest.raises(ValueError, match=r"scopes must be some of .*got \['test'\]"):
        DatasetRule("TRAINER.X.B", {}, scopes=("test",))


def test_auto_cannot_be_a_dataset_name():
    with pytest.raises(ValueError, match="'auto' cannot be a dataset name"):
        DatasetRule("TRAINER.X.WEIGHT", {"auto": 1.0})


def _node():
    cfg = CfgNode()
    cfg.X = CfgNode()
    cfg.X.WEIGHT = "auto"
    cfg.X.DIVISOR = 0
    cfg.X.NAME = "auto"
    return cfg


def test_a_number_replaces_auto_and_auto_a_number_on_the_command_line():
    cfg = _node()
    merge_from_list(cfg, ["X.WEIGHT", "0.5", "X.DIVISOR", "auto"])
    assert cfg.X.WEIGHT == 0.5 and cfg.X.DIVISOR == "auto"
    merge_from_list(cfg, ["X.WEIGHT", "auto", "X.DIVISOR", "4"])
    assert cfg.X.WEIGHT == "auto" and cfg.X.DIVISOR == 4
    merge_from_list(cfg, ["X.NAME", "fusion"])  # strings stay strings
    assert cfg.X.NAME == "fusion"
    with pytest.raises(ConfigError, match=r'Wrong type for config key "X.DIVISOR".*expected int like the default 4'):
        merge_from_list(cfg, ["X.DIVISOR", "fast"])  # other strings do not replace a number
    with pytest.raises(ConfigError, match=r'Wrong type for config key "X.WEIGHT"'):
        merge_from_list(_node(), ["X.WEIGHT", "True"])  # a bool is not a number here


def test_a_number_replaces_auto_in_a_config_file_and_its_base(tmp_path):
    (tmp_path / "base.yaml").write_text("X:\n  WEIGHT: 0.2\n  DIVISOR: auto\n")
    (tmp_path / "child.yaml").write_text("_BASE_: base.yaml\nX:\n  DIVISOR: 3\n")
    cfg = _node()
    merge_from_file(cfg, str(tmp_path / "child.yaml"))
    assert cfg.X.WEIGHT == 0.2 and cfg.X.DIVISOR == 3
