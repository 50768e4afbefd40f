"""Every shipped config merges to exactly the values of the committed snapshot.

The snapshot (``tests/fixtures/merged_configs.json``, written by ``python -m
tests.config_snapshot``; see that module) holds the merged config of every runnable config
under ``configs/trainers`` and ``configs/datasets`` and the defaults, as of the commit that
took it. These tests merge every config today and compare, key by key and exactly (``1``,
``1.0`` and ``True`` differ; tuples and lists are the same).

Intended changes are listed in ``tests/fixtures/merged_configs_changes.yaml``, a YAML list of
entries (one per file and key)::

    - file: configs/trainers/DeAR/vit_b16_base2new.yaml   # or: defaults
      key: TRAINER.DEAR.INFERENCE
      before: fusion        # the snapshot's value; leave out for a key that did not exist
      after: auto           # today's value; leave out for a key that no longer exists
      reason: the inference rule follows the evaluation scope

``file: defaults`` changes a default value (a trainer node's default, a new or removed key);
it applies to every config that does not set the key itself. A change of one config's value
is listed under that config's path. ``before`` and ``after`` are written as in a config YAML
and decoded the same way (``1e-5`` is the float 1e-05, ``(0.5, 1.0)`` a list).

The changes are applied to the snapshot before comparing. A test fails when
* a config merges to a value that neither the snapshot nor a listed change gives (an
  unlisted change), or that differs from a listed change's ``after``;
* an entry is stale: its ``before`` is not the snapshot's value, it names a file the
  snapshot does not have, it repeats another entry, or it changes nothing;
* a runnable config is not in the snapshot (add it with ``python -m tests.config_snapshot
  --add-new``) or a snapshot config no longer exists (config file names are kept).

A method added since the snapshot was taken (its trainer node and its config folder wholly
absent from the snapshot; ``config_snapshot.new_trainer_nodes`` / ``new_method_configs``) is new,
not changed: its configs must merge, and are pinned when the snapshot is next written.

To fold the listed changes into the snapshot, rewrite it (``python -m tests.config_snapshot``)
and empty the changes file in the same commit.
"""
from pathlib import Path

import pytest
from fast_cases import representative

import config_snapshot as snap

CHANGES = Path(__file__).resolve().parent / "fixtures" / "merged_configs_changes.yaml"
SNAPSHOT = snap.load_snapshot()


@pytest.fixture(scope="module")
def expected():
    """The snapshot with the intended changes applied, and the changes themselves."""
    changes = snap.load_changes(CHANGES)
    applied, _ = snap.apply_changes(SNAPSHOT, changes)
    return applied, changes


def listed_keys(changes, path):
    return {change["key"] for change in changes if change["file"] in ("defaults", path)}


def test_the_change_list_matches_the_snapshot():
    _, problems = snap.apply_changes(SNAPSHOT, snap.load_changes(CHANGES))
    assert not problems, "\n".join(problems)


def pinned(flat, applied):
    """``flat`` without the keys of trainer nodes added since the snapshot was taken (not pinned yet)."""
    new_nodes = snap.new_trainer_nodes(applied["defaults"], flat)
    return {key: value for key, value in flat.items() if snap.trainer_node(key) not in new_nodes}


def test_defaults_match_the_snapshot(expected):
    applied, changes = expected
    problems = snap.differences(applied["defaults"], pinned(snap.flatten(snap.default_config()), applied),
                                listed_keys(changes, "defaults"))
    assert not problems, "The defaults changed:\n" + "\n".join(problems)


def fast_configs(paths):
    """The configs compared in the fast loop: every dataset config and one config per method folder
    (its synthetic.yaml, else its first); the full suite compares every config."""
    folders = {}
    for path in sorted(paths):
        folders.setdefault(path.rsplit("/", 1)[0] if path.startswith("configs/trainers/") else path, []).append(path)
    return {next((path for path in group if path.endswith("/synthetic.yaml")), group[0]) for group in folders.values()}


@pytest.mark.parametrize("path", representative(sorted(SNAPSHOT["files"]), fast_configs(SNAPSHOT["files"])))
def test_config_merges_to_the_snapshot(expected, path):
    applied, changes = expected
    problems = snap.differences(applied["files"][path], pinned(snap.merged_config(path), applied),
                                listed_keys(changes, path))
    assert not problems, f"{path} merges to other values than the snapshot:\n" + "\n".join(problems)


def test_every_runnable_config_is_in_the_snapshot():
    """...except those of a method added since the snapshot was taken, which must merge."""
    shipped = snap.shipped_configs()
    new = snap.new_method_configs(SNAPSHOT["files"], shipped)
    missing = sorted(set(shipped) - set(SNAPSHOT["files"]) - set(new))
    assert not missing, (f"Configs missing from the snapshot: {missing}. Add them with "
                         "python -m tests.config_snapshot --add-new")
    for path in new:
        assert snap.merged_config(path)  # an unknown key or a missing _BASE_ fails here


# The machinery itself, on a small hand-written snapshot.

TOY = {
    "defaults": {"OPTIM.LR": 0.1, "OPTIM.MAX_EPOCH": 10, "TRAINER.X.MODE": "fusion"},
    "files": {"a.yaml": {"OPTIM.LR": 0.002}, "b.yaml": {"TRAINER.X.MODE": "fusion"}},
}


def change(file, key, reason="why", **values):
    entry = {"file": file, "key": key, "reason": reason}
    entry.update({name: values.get(name, snap.ABSENT) for name in ("before", "after")})
    return entry


def test_without_changes_files_get_the_defaults_plus_their_own_keys():
    applied, problems = snap.apply_changes(TOY, [])
    assert problems == []
    assert applied["files"]["a.yaml"] == {"OPTIM.LR": 0.002, "OPTIM.MAX_EPOCH": 10, "TRAINER.X.MODE": "fusion"}


def test_a_default_change_reaches_only_the_configs_that_do_not_set_the_key():
    applied, problems = snap.apply_changes(TOY, [change("defaults", "TRAINER.X.MODE", before="fusion", after="auto")])
    assert problems == []
    assert applied["files"]["a.yaml"]["TRAINER.X.MODE"] == "auto"
    assert applied["files"]["b.yaml"]["TRAINER.X.MODE"] == "fusion"  # b pinned the old default


def test_added_and_removed_keys():
    applied, problems = snap.apply_changes(TOY, [
        change("defaults", "TRAINER.X.NEW", after=3),
        change("a.yaml", "OPTIM.LR", before=0.002),
    ])
    assert problems == []
    assert applied["defaults"]["TRAINER.X.NEW"] == 3
    assert "OPTIM.LR" not in applied["files"]["a.yaml"] and applied["files"]["b.yaml"]["OPTIM.LR"] == 0.1


@pytest.mark.parametrize("entry, message", [
    (change("a.yaml", "OPTIM.LR", before=0.003, after=0.004), "is stale: its before is 0.003, but the snapshot has 0.002"),
    (change("a.yaml", "OPTIM.MAX_EPOCH", before=10.0, after=20), "is stale"),  # 10.0 is not 10
    (change("a.yaml", "OPTIM.NEW", before=1, after=2), "the snapshot has <absent>"),
    (change("c.yaml", "OPTIM.LR", before=0.1, after=0.2), "'c.yaml' is neither 'defaults' nor a config"),
    (change("a.yaml", "OPTIM.LR", before=0.002, after=0.002), "changes nothing"),
])
def test_stale_or_useless_entries_are_reported(entry, message):
    _, problems = snap.apply_changes(TOY, [entry])
    assert len(problems) == 1 and message in problems[0], problems


def test_an_entry_listed_twice_is_reported():
    entry = change("a.yaml", "OPTIM.LR", before=0.002, after=0.004)
    _, problems = snap.apply_changes(TOY, [entry, dict(entry)])
    assert len(problems) == 1 and "listed twice" in problems[0]


def test_differences_name_unlisted_and_mismatched_listed_changes():
    expected = {"OPTIM.LR": 0.002, "OPTIM.MAX_EPOCH": 10, "INPUT.SIZE": [224, 224], "A": 1}
    actual = {"OPTIM.LR": 0.003, "OPTIM.MAX_EPOCH": 10.0, "INPUT.SIZE": [224, 224], "B": True}
    problems = snap.differences(expected, actual, listed_keys={"OPTIM.LR"})
    assert problems == [
        "A: the snapshot has 1, but the config now gives <absent> (an unlisted change).",
        "B: the snapshot has <absent>, but the config now gives True (an unlisted change).",
        "OPTIM.LR: the listed change says after = 0.002, but the config now gives 0.003.",
        "OPTIM.MAX_EPOCH: the snapshot has 10, but the config now gives 10.0 (an unlisted change).",
    ]


def test_a_new_method_is_told_from_a_changed_one():
    """A trainer node or a config folder the snapshot has nothing of is new; a new key of a pinned
    node or a new config of a pinned folder is not."""
    pinned = {"OPTIM.LR": 0.1, "TRAINER.NAME": "", "TRAINER.X.MODE": "fusion", "TRAINER.X.DEEP.K": 1}
    keys = ["OPTIM.LR", "TRAINER.NAME", "TRAINER.X.MODE", "TRAINER.X.NEW", "TRAINER.Y.N_CTX", "TRAINER.Y.DEEP.K"]
    assert snap.new_trainer_nodes(pinned, keys) == {"TRAINER.Y"}
    files = {"configs/trainers/X/a.yaml": {}, "configs/datasets/pets.yaml": {}}
    paths = ["configs/trainers/X/a.yaml", "configs/trainers/X/b.yaml", "configs/trainers/Y/a.yaml",
             "configs/trainers/Y/deeper/c.yaml", "configs/datasets/cars.yaml"]
    assert snap.new_method_configs(files, paths) == ["configs/trainers/Y/a.yaml", "configs/trainers/Y/deeper/c.yaml"]


def test_tuples_are_compared_as_lists():
    assert snap.flatten({"INPUT": {"SIZE": (224, 224), "SCALES": ((0.5, 1.0),)}}) == {
        "INPUT.SIZE": [224, 224], "INPUT.SCALES": [[0.5, 1.0]]}
    assert snap.differences({"INPUT.SIZE": [224, 224]}, {"INPUT.SIZE": [224, 224]}) == []


def test_change_entries_are_decoded_like_config_values(tmp_path):
    path = tmp_path / "changes.yaml"
    path.write_text(
        "- file: defaults\n  key: OPTIM.WARMUP_CONS_LR\n  before: 1e-5\n  after: 2.0e-05\n  reason: r\n"
        "- file: a.yaml\n  key: INPUT.SIZE\n  before: (224, 224)\n  after: [32, 32]\n  reason: r\n"
        "- file: a.yaml\n  key: TRAINER.X.MODE\n  after: auto\n  reason: r\n"
    )
    first, second, third = snap.load_changes(path)
    assert first["before"] == 1e-05 and isinstance(first["before"], float) and first["after"] == 2e-05
    assert second["before"] == [224, 224] and second["after"] == [32, 32]
    assert third["before"] is snap.ABSENT and third["after"] == "auto"


@pytest.mark.parametrize("text, message", [
    ("file: a.yaml\n", "must hold a YAML list"),
    ("- file: a.yaml\n  key: K\n  after: 1\n", "missing field(s) ['reason']"),
    ("- file: a.yaml\n  key: K\n  after: 1\n  reason: r\n  note: x\n", "unknown field(s) ['note']"),
    ("- file: a.yaml\n  key: K\n  reason: r\n", "give before, after or both"),
])
def test_malformed_change_lists_are_errors(tmp_path, text, message):
    path = tmp_path / "changes.yaml"
    path.write_text(text)
    with pytest.raises(snap.ChangeListError, match="entry 1|YAML list") as error:
        snap.load_changes(path)
    assert message in str(error.value)
