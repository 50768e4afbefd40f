"""One owner of the run folder: every file of a run folder is named in ``vlprompt/run_layout.py``
(the layout RunFolder serves) and nowhere else, and a run writes only files that layout names.

* The source of the project spells no run-folder file name outside the layout: a string in the
  code (docstrings aside, which describe the layout) that holds ``config.yaml``, ``model.pth.tar-``
  ... is a second place that would have to change with the layout; a bare folder or file name
  (``tensorboard``, ``test_time``, ``checkpoint``) counts where it is joined into a path.
* Every path RunFolder gives is one the layout describes, and a training run and a test-time run
  leave only files the layout describes (``RunFolder.unknown_files``).
"""
import ast
import collections
import os
import re
from pathlib import Path

import pytest

from vlprompt import run_layout
from vlprompt.engine.run_folder import RunFolder
from vlprompt.testing import write_oxford_pets_tree
from vlprompt_app.commands import train

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "vlprompt" / "run_layout.py"
SOURCES = ("vlprompt", "vlprompt_app", "trainers", "datasets", "tools")

# Spelled inside a longer string they are still the file's name.
NAMES = (
    run_layout.CONFIG_FILENAME, run_layout.RESULTS_FILENAME, run_layout.LOG_FILENAME, run_layout.LOCK_FILENAME,
    run_layout.CONSOLE_FILENAME, run_layout.CMAT_FILENAME, run_layout.BAD_IMAGES_FILENAME,
    run_layout.WISEFT_SWEEP_FILENAME, run_layout.BEST_CHECKPOINT,
    os.path.commonprefix([run_layout.epoch_checkpoint_name(1), run_layout.epoch_checkpoint_name(2)]),
    os.path.commonprefix([run_layout.log_name(1), run_layout.log_name(2)]),
)
# Plain words, which are names only where they become part of a path.
PATH_WORDS = (run_layout.TENSORBOARD_DIRNAME, run_layout.TEST_TIME_DIRNAME, run_layout.POINTER_FILENAME)
PATH_CALLS = ("join", "Path", "joinpath")


def source_files():
    files = [ROOT / "train.py"]
    for folder in SOURCES:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [path for path in files if path != OWNER]


def read_tree(tree):
    """(string constants in ``ast.walk`` order, ids of the docstring nodes (first statement of a
    module, class or function), {id(node): its parent}) of ``tree``, from one walk."""
    strings, docstrings, parents = [], set(), {}
    todo = collections.deque([tree])
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node)
        elif isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
            todo.append(child)
    return strings, docstrings, parents


def in_path(node, parents):
    """True when the string ``node`` is an argument of ``os.path.join`` / ``Path(...)`` /
    ``joinpath`` or an operand of ``/`` (directly, or as a part of an f-string there)."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.JoinedStr):
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in PATH_CALLS
    return False


def spelled_names(source):
    """(line, string) of every string of ``source`` that spells a run-folder file name."""
    if not any(word in source for word in NAMES + PATH_WORDS):
        return []
    strings, skip, parents = read_tree(ast.parse(source))
    return [(node.lineno, node.value) for node in strings if id(node) not in skip and (
        any(name in node.value for name in NAMES) or (node.value in PATH_WORDS and in_path(node, parents)))]


def test_run_folder_file_names_are_spelled_only_in_the_layout():
    spelled = [f"{path.relative_to(ROOT)}:{line}: {text!r}" for path in source_files()
               for line, text in spelled_names(path.read_text(encoding="utf-8"))]
    assert spelled == [], "run-folder file names spelled outside vlprompt/run_layout.py (take them from " \
                          "RunFolder or the layout):\n" + "\n".join(spelled)


@pytest.mark.parametrize("source, expected", [
    ('path = os.path.join(folder, "cmat.pt")', [(1, "cmat.pt")]),
    ('name = f"model.pth.tar-{epoch}"', [(1, "model.pth.tar-")]),
    ('message = "no log-rank1.txt"', [(1, "no log-rank1.txt")]),
    ('writer = Path(output) / "tensorboard"', [(1, "tensorboard")]),
    ('writer = osp.join(output, "tensorboard")', [(1, "tensorboard")]),
    ('folder = f"{output}/" "test_time"', []),  # not a path call: a plain word
    ('results = {"test_time": throughput}', []),
    ('from torch.utils import tensorboard\nmodule = "torch.utils.tensorboard"', []),
    ('def f():\n    """Writes ``config.yaml``."""', []),
])
def test_the_source_check_finds_names_in_code_not_in_docstrings(source, expected):
    assert spelled_names(source) == expected


def test_every_path_of_the_owner_is_in_the_layout(tmp_path):
    folder = RunFolder(tmp_path)
    paths = [
        folder.config_path, folder.results_path, folder.console_path, folder.cmat_path, folder.bad_images_path,
        folder.wiseft_sweep_path, folder.lock().path, *folder.episode_record_paths("test"),
        folder.checkpoint_path("prompt_learner", 3), folder.checkpoint_path("prompt_learner"),
        folder.mid_epoch_checkpoint_path("prompt_learner", 2, 5), folder.model_dir("prompt_learner") / run_layout.POINTER_FILENAME,
        folder.tensorboard_dir / "events.out.tfevents.1.host", tmp_path / run_layout.log_name(0),
        tmp_path / run_layout.log_name(3),
        tmp_path / run_layout.timestamped_log_name(run_layout.LOG_FILENAME, run_layout.log_start_time(
            "log.txt-2024-05-06-07-08-09")),
    ]
    undescribed = [str(path) for path in paths if run_layout.describe(path.relative_to(tmp_path).as_posix()) is None]
    assert undescribed == []
    assert run_layout.describe("notes.txt") is None and run_layout.describe("prompt_learner/weights.pt") is None
    assert run_layout.checkpoint_position(folder.mid_epoch_checkpoint_path("m", 2, 5).name) == (2, 5)
    assert run_layout.checkpoint_position(folder.checkpoint_path("m", 7).name) == (7, 0)
    assert run_layout.checkpoint_position(folder.checkpoint_path("m").name) is None


def test_unknown_files_lists_what_the_layout_does_not_name(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_results({"completed": True})
    folder.checkpoint_path("prompt_learner", 1).parent.mkdir()
    folder.checkpoint_path("prompt_learner", 1).write_bytes(b"")
    (tmp_path / "prompt_learner" / "weights.pt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert folder.unknown_files() == ["notes.txt", "prompt_learner/weights.pt"]


@pytest.fixture(scope="module")
def pets_root(tmp_path_factory):
    """A miniature OxfordPets tree with one unreadable training image."""
    root = tmp_path_factory.mktemp("owner_data")
    dataset = Path(write_oxford_pets_tree(str(root), train=4, val=2, test=2))
    next(iter(sorted((dataset / "images").iterdir()))).write_bytes(b"not an image")
    return root


def run_train(pets_root, tiny_clip_files, output, trainer, config, *options):
    config_file, weights = tiny_clip_files
    argv = ["--root", str(pets_root), "--trainer", trainer, "--dataset-config-file", "configs/datasets/oxford_pets.yaml",
            "--config-file", config, "--output-dir", str(output), "--seed", "1", *options,
            "MODEL.BACKBONE.NAME", config_file, "MODEL.BACKBONE.WEIGHTS", weights, "DATASET.SKIP_BAD_IMAGES", "True"]
    assert train.run(argv) == 0


def present(folder):
    """What the layout says each file of ``folder`` is."""
    return {run_layout.describe(path.relative_to(folder).as_posix()) for path in folder.rglob("*") if path.is_file()}


def test_a_training_run_writes_only_files_the_layout_names(pets_root, tiny_clip_files, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    output = tmp_path / "coop"
    run_train(pets_root, tiny_clip_files, output, "CoOp", "configs/trainers/CoOp/toy.yaml",
              "OPTIM.MAX_EPOCH", "2", "TRAIN.CHECKPOINT_ITERS", "1", "TEST.FINAL_MODEL", "best_val",
              "TEST.COMPUTE_CMAT", "True")
    assert RunFolder(output).unknown_files() == []
    assert present(output) == {
        "the log", "the merged config of a training run", "the classes the model scores, by label",
        "the record of the final evaluation", "the confusion matrix",
        "the unreadable image files", "a checkpoint after an epoch", "the checkpoint of the best val result",
        "the pointer to the checkpoint written last",
    }
    assert RunFolder(output).tensorboard_dir.is_dir()
    # the mid-epoch checkpoints are deleted when training ends; the log names every checkpoint written
    saved = re.findall(r'^(?:Checkpoint saved to|Best checkpoint saved to) "?(.+?)"?$',
                       RunFolder(output).logs()[0].read_text(), re.M)
    written = {run_layout.describe(Path(path).relative_to(output).as_posix()) for path in saved}
    assert written == {"a mid-epoch checkpoint", "a checkpoint after an epoch", "the checkpoint of the best val result"}


def test_a_test_time_run_writes_only_files_the_layout_names(pets_root, tiny_clip_files, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    output = tmp_path / "tpt"
    run_train(pets_root, tiny_clip_files, output, "TPT", "configs/trainers/TPT/synthetic.yaml", "--eval-only",
              "TRAINER.TPT.NUM_VIEWS", "4")
    assert RunFolder(output).unknown_files() == []
    assert {"the header of a split's test-time episode records", "a split's test-time episode records"} <= present(output)
