"""train.py answers --help and an unknown --trainer before torch and the methods are imported, and a
config error before open_clip and torchvision are (they are imported where models and images are built)."""
import subprocess
import sys
from pathlib import Path

from vlprompt.engine import TRAINER_REGISTRY
from vlprompt_app.project import registered_trainer_names

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from vlprompt_app.commands import train
try:
    status = train.run({argv!r})
except SystemExit as exit:
    status = exit.code
print(status, sorted(name for name in ("open_clip", "torch", "torchvision", "trainers") if name in sys.modules))
"""


def probe(argv):
    """(exit status, heavy modules imported) of train.run(argv) in a fresh interpreter."""
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                            check=True, cwd=ROOT)
    status, modules = result.stdout.strip().splitlines()[-1].split(" ", 1)
    return int(status), modules, result.stderr


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


def test_a_config_error_is_reported_before_open_clip_and_torchvision_load():
    status, modules, stderr = probe(["--trainer", "CoOp", "--config-file", "configs/trainers/CoOp/vit_b16_ep50.yaml",
                                     "--output-dir", "unused", "OPTIM.LRR", "0.1"])
    assert (status, modules) == (2, "['torch', 'trainers']")
    assert 'Unknown config key "OPTIM.LRR"' in stderr


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


def test_open_clip_loads_without_transformers_until_a_hugging_face_text_tower_needs_it():
    """A model with open_clip's own text tower does not import transformers (1-2 s of CPU per
    process); enabling Hugging Face text towers gives the text-tower class open_clip builds the
    real transformers names (it said "pip install transformers" without them)."""
    result = subprocess.run([sys.executable, "-c", HF_PROBE], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-2:] == ["after a CLIP text tower: False True", "after enabling: True True"], result.stdout
