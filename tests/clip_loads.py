"""One load per CLIP weights file for the tests of a module: ``shared_clip_loads``, a module fixture that
the registry-wide contracts use (tests/test_mixed_precision.py, test_compile.py, test_trainer_families.py,
test_predict_all_trainers.py), which build a trainer, and so load its CLIP, in nearly every test.

``vlprompt.clip.load_clip`` builds the model (open_clip draws its random initialisation) and then reads the
weights file: about 0.15 s of CPU for the synthetic CLIP, most of a contract trainer's build. Under the
fixture, the first load of a (backbone, weights file, device) is kept and every load returns a deep copy of
it, so a test gets a model of its own, equal to a fresh load, and what it changes in it (unfrozen weights,
a fine-tuning step) reaches no other test. A load leaves torch's random state as it found it, whether it
builds the model or copies it, so what a test draws after building a trainer (prompt initialisations) does
not depend on which test of the module loaded the file first. Loads of anything but a weights file
(``random``, pretrained tags) are not kept.
"""
import copy
import os
import sys

import pytest
import torch

from vlprompt.clip import loading

_PACKAGES = ("vlprompt", "vlprompt_app", "trainers")


def _stamp(path):
    """(size, modification time) of a file, None for anything else (a model name)."""
    return (os.stat(path).st_size, os.stat(path).st_mtime_ns) if os.path.isfile(path) else None


def keeping_loads(load):
    """``load`` (load_clip's signature) keeping one model per weights file and returning deep copies."""
    kept = {}

    def load_clip(name, weights="", device="cpu", trust_torchscript=False, image_size=None):
        if image_size is not None or not (isinstance(weights, str) and os.path.isfile(weights)):
            return load(name, weights, device=device, trust_torchscript=trust_torchscript, image_size=image_size)
        key = (name, _stamp(name), weights, _stamp(weights), str(device), trust_torchscript)
        if key not in kept:
            state = torch.random.get_rng_state()
            try:
                kept[key] = load(name, weights, device=device, trust_torchscript=trust_torchscript)
            finally:
                torch.random.set_rng_state(state)
        model, info = kept[key]
        return copy.deepcopy(model), copy.deepcopy(info)

    load_clip.__wrapped__ = load
    return load_clip


@pytest.fixture(scope="module")
def shared_clip_loads():
    """``load_clip`` keeps its models for this module's tests, wherever the project imported it by name."""
    original = loading.load_clip
    shared = keeping_loads(original)
    with pytest.MonkeyPatch.context() as patch:
        for module in _project_modules():
            if getattr(module, "load_clip", None) is original:
                patch.setattr(module, "load_clip", shared)
        yield shared
    for module in _project_modules():  # imported meanwhile, from a patched module
        if getattr(module, "load_clip", None) is shared:
            module.load_clip = original


def _project_modules():
    return [module for name, module in list(sys.modules.items()) if name.split(".")[0] in _PACKAGES]
