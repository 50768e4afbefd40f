"""The exported classifier file: the library alone loads a class-text-feature head and predicts what
the run predicts; another backbone weights file is refused by its sha256; a head that needs its
method's code is refused by the library and named."""
import os
import shutil

import pytest
import torch
from test_predict import ROOT, run_test_split, run_train

import vlprompt
from vlprompt.config import ConfigError
from vlprompt.export import file_sha256, read_export
from vlprompt.testing import write_oxford_pets_tree
from vlprompt_app import load_run
from vlprompt_app.export import export_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(data root, CoOp run, CLIP-Adapter run) on the toy OxfordPets with the tiny synthetic CLIP."""
    base = tmp_path_factory.mktemp("export")
    write_oxford_pets_tree(str(base / "data"), train=4, val=1, test=3)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        run_train(str(base / "data"), "CoOp", "CoOp/synthetic.yaml", base / "coop")
        run_train(str(base / "data"), "CLIPAdapter", "CLIPAdapter/synthetic.yaml", base / "adapter")
    finally:
        os.chdir(cwd)
    return str(base / "data"), base / "coop", base / "adapter"


def test_a_text_feature_export_loads_with_the_library_and_predicts_as_the_run(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    data, coop, _ = runs
    record = export_run(coop, tmp_path / "coop.pt")
    stored = read_export(tmp_path / "coop.pt")
    assert stored["head"]["kind"] == "cosine" and set(stored["head"]) == {"kind", "text_features"}
    assert stored["backbone"]["sha256"] == file_sha256(record["backbone"]["weights"])
    assert stored["head"]["text_features"].shape == (len(stored["classnames"]), 128)
    predictor = load_run(coop)
    paths = [item.impath for item in run_test_split(coop, data)]
    capsys.readouterr()
    classifier = vlprompt.load_classifier(str(tmp_path / "coop.pt"))
    assert capsys.readouterr().out == ""  # the build log goes to the logger vlprompt.build
    for mine, theirs in zip(classifier.predict(paths, topk=3), predictor.predict(paths, topk=3)):
        assert mine.labels == theirs.labels
        assert mine.probabilities == pytest.approx(theirs.probabilities, abs=1e-5)  # float32 rounding by batch size


def test_another_weights_file_is_refused_with_both_hashes(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    _, coop, _ = runs
    record = export_run(coop, tmp_path / "coop.pt")
    other = tmp_path / "other.pt"
    shutil.copy(record["backbone"]["weights"], other)
    with open(other, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ConfigError, match=rf'"{other}" has sha256 {file_sha256(other)}, but the classifier was '
                                          rf'exported with sha256 {record["backbone"]["sha256"]}'):
        vlprompt.load_classifier(str(tmp_path / "coop.pt"), weights=str(other))


def test_a_method_head_is_named_by_the_library_and_loads_through_the_app(runs, tmp_path, monkeypatch):
    from vlprompt_app.export import load_exported

    monkeypatch.chdir(ROOT)
    _, _, adapter = runs
    export_run(adapter, tmp_path / "adapter.pt")
    with pytest.raises(ConfigError, match="holds a CLIPAdapter model.*vlprompt_app.export.load_exported"):
        vlprompt.load_classifier(str(tmp_path / "adapter.pt"))
    exported = load_exported(tmp_path / "adapter.pt")
    image = torch.zeros(3, 32, 32)
    (mine,) = exported.predict(image, topk=2)
    (theirs,) = load_run(adapter).predict(image, topk=2)
    assert mine.labels == theirs.labels and mine.probabilities == pytest.approx(theirs.probabilities, abs=1e-6)


def test_a_truncated_export_file_is_named_damaged(tmp_path):
    """A file cut short (an interrupted copy) is refused with what it is, not a raw loader error."""
    from vlprompt.export import save_export

    path = tmp_path / "model.pt"
    save_export(path, {"trainer": "CoOp", "classnames": ["a", "b"], "head": {"kind": "cosine",
                                                                          "text_features": torch.randn(2, 8)}})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=rf'^"{path}" cannot be read as an exported classifier: the file is damaged '
                                          rf"\(for example cut short by an interrupted copy or download; it has "
                                          rf"{len(data) // 2} bytes\) or was not written by tools/export.py. Copy or "
                                          r"export it again \(\w+Error: "):
        read_export(path)

