"""The episodic test-time base (vlprompt.engine.test_time): per-image resume, torn records, throughput."""
import json
import os
import shutil
import struct

import pytest
import torch
from baseline_setup import toy_pets_cfg

import datasets  # noqa: F401  (registers OxfordPets)
from vlprompt.engine import build_trainer
from vlprompt.engine.run_folder import RunFolder, RunFolderError
from vlprompt.engine.test_time import EpisodeLog, select_confident
from vlprompt.testing import OXFORD_PETS_TOY_CLASSES, write_oxford_pets_tree


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ttt_data"))
    write_oxford_pets_tree(root, classes=OXFORD_PETS_TOY_CLASSES[:3], train=2, val=1, test=2)
    return root


def make_trainer(data_root, clip_files, output_dir, *opts):
    return build_trainer(toy_pets_cfg("RAdaTTT", "RAdaTTT/toy.yaml", data_root, str(output_dir), clip_files, *opts))


class Interrupted(Exception):
    pass


def counting(trainer, stop_after=None):
    """Wrap ``adapt_and_predict`` to count episodes and raise Interrupted after ``stop_after``."""
    calls = []
    adapt = trainer.adapt_and_predict

    def wrapped(views):
        if stop_after is not None and len(calls) == stop_after:
            raise Interrupted
        calls.append(views[0].clone())
        return adapt(views)

    trainer.adapt_and_predict = wrapped
    return calls


def logged_logits(output_dir):
    with open(os.path.join(output_dir, "test_time", "test.bin"), "rb") as f:
        data = f.read()
    return data


@pytest.mark.slow  # two test-time runs: interrupt and resume
def test_an_interrupted_run_resumes_after_the_last_finished_image(data_root, tiny_clip_files, tmp_path):
    # batch size 4: the interruption falls inside the second batch's first image
    whole = make_trainer(data_root, tiny_clip_files, tmp_path / "whole", "DATALOADER.TEST.BATCH_SIZE", "4")
    whole_calls = counting(whole)
    reference = whole.test()
    assert len(whole_calls) == 6 and whole.throughput["images"] == 6 and whole.throughput["images_per_s"] > 0

    first = make_trainer(data_root, tiny_clip_files, tmp_path / "cut", "DATALOADER.TEST.BATCH_SIZE", "4")
    counting(first, stop_after=5)
    with pytest.raises(Interrupted):
        first.test()
    # a kill during the next append leaves half a record: it is dropped on resume
    with open(tmp_path / "cut" / "test_time" / "test.bin", "ab") as f:
        f.write(b"\x01\x02\x03")
    resumed = make_trainer(data_root, tiny_clip_files, tmp_path / "cut", "DATALOADER.TEST.BATCH_SIZE", "3")
    resumed_calls = counting(resumed)
    accuracy = resumed.test()
    assert len(resumed_calls) == 1 and torch.equal(resumed_calls[0], whole_calls[5])  # only the 6th image
    assert accuracy == reference and resumed.last_test == whole.last_test
    assert logged_logits(tmp_path / "cut") == logged_logits(tmp_path / "whole")  # same labels and logits, same order
    resumed.save_results()
    with open(tmp_path / "cut" / "results.json") as f:
        assert json.load(f)["test_time"]["images"] == 1

    # a finished log is read back without adapting anything
    again = make_trainer(data_root, tiny_clip_files, tmp_path / "cut")
    assert len(counting(again)) == 0 and again.test() == reference and again.throughput["images"] == 0


def test_a_log_of_another_config_is_refused(data_root, tiny_clip_files, tmp_path):
    make_trainer(data_root, tiny_clip_files, tmp_path).test()
    other = make_trainer(data_root, tiny_clip_files, tmp_path, "TRAINER.RADATTT.LR", "0.02")
    with pytest.raises(RunFolderError, match="another run.*--restart.*delete .*test_time"):
        other.test()


def test_confidence_selection_keeps_the_lowest_entropy_views():
    logits = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 9.0], [1.0, 0.0]])
    assert select_confident(logits, 0.5).tolist() == [2, 1]
    assert select_confident(logits, 0.3).tolist() == [2]


def _overwrite_record(path, index, record_size, data):
    with open(path, "r+b") as f:
        f.seek(index * record_size)
        f.write(data)


def test_bad_records_are_adapted_again_with_a_line_naming_them(data_root, tiny_clip_files, tmp_path, capsys):
    """Three records of a finished log overwritten (label 999999, a NaN pattern, zeros) are found
    and recomputed, and the run ends with the uninterrupted result and log."""
    whole = make_trainer(data_root, tiny_clip_files, tmp_path / "whole")
    reference = whole.test()
    expected_log = logged_logits(tmp_path / "whole")
    log_path = tmp_path / "whole" / "test_time" / "test.bin"
    size = len(expected_log) // 6
    _overwrite_record(log_path, 1, size, struct.pack("<q", 999999))
    _overwrite_record(log_path, 3, size, struct.pack("<q", 0) + struct.pack("<f", float("nan")) * ((size - 8) // 4))
    _overwrite_record(log_path, 4, size, bytes(size))
    capsys.readouterr()

    again = make_trainer(data_root, tiny_clip_files, tmp_path / "whole")
    calls = counting(again)
    assert again.test() == reference and again.last_test == whole.last_test
    assert len(calls) == 3 and again.throughput["images"] == 3
    assert logged_logits(tmp_path / "whole") == expected_log
    out = capsys.readouterr().out
    images = [item.impath for item in again.dm.dataset.test]
    for index in (1, 3, 4):
        assert f"Adapting image {index} ({images[index]}) again: its record in {log_path}" in out
    assert out.count("again: its record") == 3 and "Resuming: 3 of 6 images" in out


def test_label_and_finiteness_checks_catch_a_record_with_a_valid_checksum(tmp_path):
    log = EpisodeLog(*RunFolder(tmp_path).episode_record_paths("test"), {"split": "test", "num_classes": 3})
    log.start()
    log.append(1, torch.tensor([0.1, 0.2, 0.3]))
    log.append(7, torch.tensor([0.1, 0.2, 0.3]))
    log.append(2, torch.tensor([0.1, float("inf"), 0.3]))
    labels, logits, bad = log.read()
    assert labels.tolist()[0] == 1 and torch.equal(logits[0], torch.tensor([0.1, 0.2, 0.3]))
    assert bad == {1: "has label 7, outside 0..2", 2: "holds non-finite logits"}


@pytest.mark.slow  # test-time runs in a moved and a copied folder
def test_a_moved_or_copied_run_folder_resumes(data_root, tiny_clip_files, tmp_path):
    first = make_trainer(data_root, tiny_clip_files, tmp_path / "cut")
    counting(first, stop_after=4)
    with pytest.raises(Interrupted):
        first.test()
    shutil.copytree(tmp_path / "cut", tmp_path / "elsewhere" / "copy")
    moved_data = str(tmp_path / "moved_data")
    shutil.copytree(data_root, moved_data)
    resumed = make_trainer(moved_data, tiny_clip_files, tmp_path / "elsewhere" / "copy")
    calls = counting(resumed)
    resumed.test()
    assert len(calls) == 2  # images 5 and 6 only
    whole = make_trainer(data_root, tiny_clip_files, tmp_path / "whole")
    whole.test()
    assert resumed.last_test == whole.last_test
    assert logged_logits(tmp_path / "elsewhere" / "copy") == logged_logits(tmp_path / "whole")


def test_a_truncated_header_is_a_run_folder_error_naming_it(data_root, tiny_clip_files, tmp_path):
    make_trainer(data_root, tiny_clip_files, tmp_path).test()
    header = tmp_path / "test_time" / "test.json"
    header.write_text(header.read_text()[:20])
    with pytest.raises(RunFolderError, match=f"{header} is not readable JSON.*Delete {tmp_path / 'test_time'}"):
        make_trainer(data_root, tiny_clip_files, tmp_path).test()
