"""Reliability guarantees (issue 11): safe loading, torn files, mid-epoch resume, bad data,
numerical faults and config faults. The kill-and-resume trials with SIGKILL are in
tests/test_kill_resume.py.
"""
import ast
import builtins
import copy
import os
import pickle
from pathlib import Path

import pytest
import torch

from vlprompt.config import get_cfg_default
from vlprompt.data.splits import UnsafePickleError, read_datum_pickle
from vlprompt.optim import build_lr_scheduler, build_optimizer
from vlprompt.utils import CheckpointError, PickledObject, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- safe loading

class _RunsCodeWhenUnpickled:
    """Unpickling this object calls ``builtins.exec`` on code that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


class _CallsOsSystemWhenUnpickled:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_malicious_checkpoint_never_runs_code(tmp_path, capsys):
    marker = tmp_path / "code_ran"
    path = tmp_path / "model.pth.tar-1"
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 1, "payload": _RunsCodeWhenUnpickled(marker)}, path)
    loaded = load_checkpoint(str(path))
    assert not marker.exists()
    assert isinstance(loaded["payload"], PickledObject) and loaded["payload"].pickled_global == "builtins.exec"
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(2))
    assert "builtins.exec" in capsys.readouterr().out

    torch.save({"state_dict": {}, "epoch": 1, "payload": _CallsOsSystemWhenUnpickled(marker)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(str(path))
    assert not marker.exists()
    assert f'Unable to load checkpoint from "{path}"' in str(info.value)
    assert "blocked" in str(info.value)


def test_a_malicious_fewshot_cache_is_refused(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "shot_1-seed_1.pkl"
    path.write_bytes(pickle.dumps({"train": [_RunsCodeWhenUnpickled(marker)], "val": []}))
    with pytest.raises(UnsafePickleError, match=rf"Refusing to unpickle {path}: it references builtins.exec"):
        read_datum_pickle(str(path))
    assert not marker.exists()


def test_a_dassl_checkpoint_resumes_the_scheduler_without_unpickling_it(tmp_path, capsys):
    """Dassl stores the scheduler after warm-up as an object; its fields still resume the live schedule."""
    cfg = get_cfg_default().OPTIM
    cfg.defrost()
    cfg.NAME, cfg.LR, cfg.MAX_EPOCH, cfg.LR_SCHEDULER = "sgd", 0.1, 6, "cosine"
    cfg.WARMUP_EPOCH, cfg.WARMUP_TYPE = 1, "constant"

    def build():
        model = torch.nn.Linear(2, 2)
        optimizer = build_optimizer(model, cfg)
        return optimizer, build_lr_scheduler(optimizer, cfg)

    def run(optimizer, scheduler, epochs):
        lrs = []
        for _ in range(epochs):
            optimizer.step()
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        return lrs

    uninterrupted = run(*build(), 6)
    optimizer, scheduler = build()
    first = run(optimizer, scheduler, 3)
    dassl_state = scheduler.state_dict()
    dassl_state["successor"] = copy.deepcopy(scheduler.successor)  # the object, with its own optimizer copy
    path = tmp_path / "dassl.pth.tar"
    torch.save({"state_dict": {}, "epoch": 3, "optimizer": optimizer.state_dict(), "scheduler": dassl_state}, path)

    optimizer, scheduler = build()
    checkpoint = load_checkpoint(str(path))
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    assert first + run(optimizer, scheduler, 3) == uninterrupted
    assert "inert placeholders" in capsys.readouterr().out


_UNSAFE_LOADERS_ALLOWED = {
    # The documented exception: OpenAI's TorchScript archives named by MODEL.BACKBONE.WEIGHTS
    # (or found in ~/.cache/clip), read with torch.jit.load.
    ("vlprompt/clip/loading.py", "torch.jit.load"),
}


def _unsafe_loader_calls(path):
    """(dotted call, line) of every call in ``path`` that can deserialise arbitrary objects."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        keywords = {kw.arg: kw.value for kw in node.keywords}
        safe_torch_load = isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value is True
        if name == "torch.load" and not safe_torch_load:
            found.append((name, node.lineno))
        elif name in ("pickle.load", "pickle.loads", "torch.jit.load", "yaml.load", "yaml.unsafe_load", "dill.load"):
            found.append((name, node.lineno))
        elif name.endswith("np.load") and isinstance(keywords.get("allow_pickle"), ast.Constant) and keywords["allow_pickle"].value:
            found.append((name, node.lineno))
    return found


def test_no_code_path_deserialises_arbitrary_objects():
    """Every load in the package, the trainers, the datasets and the tools is weights-only or restricted."""
    offenders = []
    for folder in ("vlprompt", "trainers", "datasets", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            offenders += [
                f"{relative}:{line} {name}" for name, line in _unsafe_loader_calls(path)
                if (relative, name) not in _UNSAFE_LOADERS_ALLOWED
            ]
    offenders += [f"train.py:{line} {name}" for name, line in _unsafe_loader_calls(ROOT / "train.py")]
    assert offenders == []
