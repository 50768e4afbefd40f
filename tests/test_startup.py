"""train.py answers --help and an unknown --trainer before torch and the methods are imported, and a
config error before open_clip and torchvision are (they are imported where models and images are built)."""
import subprocess
import sys
from pathlib import Path

import pytest
from forked_runs import run_script

from vlprompt.engine import TRAINER_REGISTRY
from vlprompt_app.project import registered_trainer_names

ROOT = Path(__file__).resolve().parents[1]

# train.py run as ``python train.py ARGV`` runs it (its exit status the process's), the heavy
# modules imported by then printed at exit.
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print(sorted(name for name in ("open_clip", "torch", "torchvision", "trainers")
                                     if name in sys.modules)))
sys.argv = ["train.py", *{argv!r}]
runpy.run_path("train.py", run_name="__main__")
"""


def probe(argv):
    """(exit status, heavy modules imported, stderr) of train.py with ``argv`` in a new interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, cwd=ROOT)
    return result.returncode, result.stdout.strip().splitlines()[-1], result.stderr


def test_help_imports_neither_torch_nor_the_methods():
    assert probe(["--help"])[:2] == (0, "[]")


def test_an_unknown_trainer_is_refused_before_torch_loads_with_the_registered_names():
    status, modules, stderr = probe(["--trainer", "CoOOp", "--output-dir", "unused"])
    assert (status, modules) == (2, "[]")
    assert "Unknown trainer 'CoOOp' (do you mean CoOp?). Registered trainers: ATPrompt, CLIPAdapter," in stderr


def test_the_names_read_from_the_source_are_the_registered_ones():
    """Every trainer that a module of ``trainers/`` registers, and no other name (tests may
    register toy trainers of their own in this process)."""
    project = sorted(name for name in TRAINER_REGISTRY.registered_names()
                     if TRAINER_REGISTRY.get(name).__module__.split(".")[0] == "trainers")
    assert len(project) >= 35 and registered_trainer_names() == project


@pytest.mark.e2e  # train.py in a new interpreter that imports torch (about 6 s of CPU)
def test_a_config_error_is_reported_before_open_clip_and_torchvision_load():
    """As from a shell: exit status 2 and one paragraph, no traceback (tests/test_train_cli.py checks
    each kind of bad input's paragraph in-process)."""
    status, modules, stderr = probe(["--trainer", "CoOp", "--config-file", "configs/trainers/CoOp/vit_b16_ep50.yaml",
                                     "--output-dir", "unused", "OPTIM.LRR", "0.1"])
    assert (status, modules) == (2, "['torch', 'trainers']")
    assert 'Unknown config key "OPTIM.LRR"' in stderr and "Traceback" not in stderr  # one paragraph


HF_PROBE = """
import sys
from vlprompt.clip import load_clip
from vlprompt.testing import TINY_CLIP_CONFIG
import json, os, tempfile
folder = tempfile.mkdtemp()
path = os.path.join(folder, "tiny.json")
json.dump(TINY_CLIP_CONFIG, open(path, "w"))
load_clip(path, "random")
import open_clip.hf_model as hf_model
print("after a CLIP text tower:", "transformers" in sys.modules, hf_model.transformers is None)
from vlprompt.clip.open_clip_import import enable_hf_text_towers
enable_hf_text_towers()
from open_clip.model import HFTextEncoder
namespace = HFTextEncoder.__init__.__globals__
print("after enabling:", namespace["transformers"] is sys.modules["transformers"],
      namespace["AutoConfig"].__module__.startswith("transformers."))
"""


def test_open_clip_loads_without_transformers_until_a_hugging_face_text_tower_needs_it(tmp_path):
    """A model with open_clip's own text tower does not import transformers (1-2 s of CPU per
    process); enabling Hugging Face text towers gives the text-tower class open_clip builds the
    real transformers names (it said "pip install transformers" without them). The probe runs as
    tests/forked_runs.py runs a script: in a process forked from one that imported open_clip, the
    library and the engine (and so any module they import) without transformers."""
    (tmp_path / "hf_probe.py").write_text(HF_PROBE)
    result = run_script([sys.executable, str(tmp_path / "hf_probe.py")])
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-2:] == ["after a CLIP text tower: False True", "after enabling: True True"], result.stdout
