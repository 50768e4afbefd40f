"""The downstream sets of the synthetic benchmark and their on-disk writer.

Each set is a :class:`SetSpec`: a class list (a class fixes some scene attributes, e.g.
colour and shape), a rendering style, image counts per split and a seed.
:func:`ensure_dataset` writes a set into ``<root>/<folder>/`` the first time it is
needed, in the layout of the real CoOp datasets::

    <folder>/
      images/<class_folder>/<split>_<n>.png      32x32 RGB
      split_zhou_<Name>.json                     {"train"|"val"|"test": [[path, label, classname], ...]}
      synthetic.json                             generator version, seed and style of the set

Image ``n`` of split ``s`` of class ``c`` is drawn from ``default_rng([seed, c, s, n])``,
so a set is the same on every machine. Labels follow the class list: the first half of
each class list is the base classes, the second half the new ones. The halves split the
shapes: base classes have the even-numbered shapes of ``SHAPES``, new classes the odd ones,
with every colour (texture) in both halves. So, as in a real base-to-novel split, a new
class's object is never seen in training, and a prompt fitted to the base shapes can lose
what the pretrained model knew of the others.
"""
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Dict, Tuple

import numpy as np

from vlprompt.data.datasets.base_dataset import DatasetLayoutError
from vlprompt.utils import atomic_write

from .world import COLORS, PRETRAIN_STYLE, SHAPES, TEXTURES, RenderStyle, render, sample_scene

__all__ = [
    "GENERATOR_VERSION", "SynthClass", "SetSpec", "SETS", "DOWNSTREAM_STYLE", "ensure_dataset",
    "StaleSyntheticDataError",
]

GENERATOR_VERSION = 3
SPLITS = ("train", "val", "test")
META_FILE = "synthetic.json"

# Main downstream style: a consistent shift from pretraining that keeps objects
# recognisable: pale plain backgrounds and huge objects, neither ever drawn in pretraining.
DOWNSTREAM_STYLE = RenderStyle(backgrounds=("bright",), sizes=("huge",))


class StaleSyntheticDataError(DatasetLayoutError):
    """A generated folder was written by another generator version or seed."""


@dataclass(frozen=True)
class SynthClass:
    """One class: its name in prompts and the scene attributes it fixes."""

    name: str
    attributes: Dict[str, str]

    @property
    def folder(self):
        return self.name.replace(" ", "_")


@dataclass(frozen=True)
class SetSpec:
    """A downstream set (see the module docstring).

    Attributes:
        name: dataset class name (split file ``split_zhou_<name>.json``).
        folder: folder under DATASET.ROOT.
        classes: SynthClass list in label order.
        style: RenderStyle of its images.
        counts: images per class in train, val and test.
        seed: generator seed.
        test_only: an evaluation-only set (domain generalisation): its split file lists
            the test images as train as well (as CoOp's ImageNet-V2/-Sketch classes do)
            and val is empty.
    """

    name: str
    folder: str
    classes: Tuple[SynthClass, ...]
    style: RenderStyle
    counts: Tuple[int, int, int] = (24, 6, 25)
    seed: int = 0
    test_only: bool = False
    description: str = field(default="", compare=False)

    @property
    def split_file(self):
        return f"split_zhou_{self.name}.json"


def _split_by_second(first, second, name, attributes):
    """Classes first x second: base half (even index into ``second``) then new half (odd), each in grid order."""
    grid = [(i, j) for i in range(len(first)) for j in range(len(second))]
    ordered = [c for c in grid if c[1] % 2 == 0] + [c for c in grid if c[1] % 2 == 1]
    return tuple(
        SynthClass(name(first[i], second[j]), dict(zip(attributes, (first[i], second[j])))) for i, j in ordered
    )


COLOR_SHAPE_CLASSES = _split_by_second(tuple(COLORS), SHAPES, lambda c, s: f"{c} {s}", ("color", "shape"))
TEXTURE_SHAPE_CLASSES = _split_by_second(TEXTURES, SHAPES, lambda t, s: f"{t} {s}", ("texture", "shape"))

SETS = {
    spec.name: spec
    for spec in (
        SetSpec("SyntheticShapes", "synthetic_shapes", COLOR_SHAPE_CLASSES, DOWNSTREAM_STYLE, seed=1,
                description="80 colour-shape classes, main set"),
        SetSpec("SyntheticPatterns", "synthetic_patterns", TEXTURE_SHAPE_CLASSES, DOWNSTREAM_STYLE, seed=2,
                description="40 texture-shape classes, cross-dataset target"),
        SetSpec("SyntheticShapesV2", "synthetic_shapes_v2", COLOR_SHAPE_CLASSES,
                DOWNSTREAM_STYLE.evolve(distractor_prob=0.5), counts=(0, 0, 15), seed=3, test_only=True,
                description="main set re-rendered, half of the images with a grey distractor object"),
        SetSpec("SyntheticShapesSketch", "synthetic_shapes_sketch", COLOR_SHAPE_CLASSES,
                DOWNSTREAM_STYLE.evolve(backgrounds=("paper",), textures=("solid",), outline=True),
                counts=(0, 0, 15), seed=4, test_only=True,
                description="main set drawn as coloured outlines on paper"),
        SetSpec("SyntheticScenes", "synthetic_scenes",
                tuple(SynthClass(shape, {"shape": shape}) for shape in SHAPES), PRETRAIN_STYLE,
                counts=(0, 0, 200), seed=5, test_only=True,
                description="scenes drawn as in pretraining (every size, background, texture and location), "
                            "the images head-role discovery decomposes"),
    )
}


def _meta(spec):
    """What the generated folder records about its generator (JSON types only)."""
    meta = {"generator_version": GENERATOR_VERSION, "name": spec.name, "seed": spec.seed,
            "counts": list(spec.counts), "style": asdict(spec.style)}
    return json.loads(json.dumps(meta))


def _write(spec, folder):
    """Render every image of ``spec`` into ``folder`` and write its split file and meta file."""
    split = {part: [] for part in SPLITS}
    for label, synth_class in enumerate(spec.classes):
        class_dir = os.path.join(folder, "images", synth_class.folder)
        os.makedirs(class_dir)
        for part_index, (part, count) in enumerate(zip(SPLITS, spec.counts)):
            for n in range(count):
                rng = np.random.default_rng([spec.seed, label, part_index, n])
                scene = sample_scene(rng, spec.style, **synth_class.attributes)
                relative = f"{synth_class.folder}/{part}_{n:03d}.png"
                render(scene, rng, spec.style).save(os.path.join(folder, "images", relative), compress_level=1)
                split[part].append([relative, label, synth_class.name])
    if spec.test_only:
        split["train"] = list(split["test"])
    with atomic_write(os.path.join(folder, spec.split_file), "w") as f:
        json.dump(split, f)
    with atomic_write(os.path.join(folder, META_FILE), "w") as f:
        json.dump(_meta(spec), f, indent=2)


def ensure_dataset(root, spec):
    """The folder of ``spec`` under ``root``, rendered first if it does not exist.

    The set is written to a temporary folder and renamed into place, so parallel runs
    and interrupted runs never see a half-written set.

    Returns:
        str: the absolute dataset folder.

    Raises:
        StaleSyntheticDataError: the folder exists but was generated by another
            generator version or seed (delete it to render it again).
    """
    root = os.path.abspath(os.path.expanduser(root))
    dataset_dir = os.path.join(root, spec.folder)
    if not os.path.isdir(dataset_dir):
        print(f"Rendering the synthetic set {spec.name} into {dataset_dir} (first use)")
        os.makedirs(root, exist_ok=True)
        staging = f"{dataset_dir}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _write(spec, staging)
            os.rename(staging, dataset_dir)
        except OSError:
            if not os.path.isdir(dataset_dir):  # not a parallel run that finished first
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    meta_path = os.path.join(dataset_dir, META_FILE)
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        expected = _meta(spec)
        differing = [key for key in expected if meta.get(key) != expected[key]]
        if differing:
            changes = "; ".join(
                "a different rendering style" if key == "style" else f"{key} {meta.get(key)} (now {expected[key]})"
                for key in differing
            )
            raise StaleSyntheticDataError(
                f"{dataset_dir} holds the synthetic set {spec.name} as another version of the generator "
                f"wrote it: {changes}. Delete the folder to render it again."
            )
    return dataset_dir
