"""The synthetic benchmark's datasets (rendered into DATASET.ROOT on first use).

Not a real-image benchmark: procedurally drawn 32x32 objects (vlprompt.synthetic) that
let every method and protocol run offline on a CPU with the project's tiny CLIP.

* SyntheticShapes: 80 colour-shape classes ("red star"); base = first 40 labels (the
  even-numbered shapes in every colour), new = the other five shapes.
* SyntheticPatterns: 40 texture-shape classes ("striped star"), cross-dataset target.
* SyntheticShapesV2, SyntheticShapesSketch: test-only re-renderings of SyntheticShapes
  (half of the images with a grey distractor object; coloured outlines on paper), the
  domain-generalisation targets.
* SyntheticScenes: test-only scenes drawn as in pretraining (every size, background,
  texture and location; 10 shape classes), the images ``tools/head_roles.py`` decomposes.

Once written, a set is an ordinary CoOp-layout dataset read through
``prepare_coop_splits``; the few-shot caches go to its ``split_fewshot/``.
"""
from functools import partial

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetLayoutError
from vlprompt.data.descriptions import register_generated_descriptions
from vlprompt.data.splits import CoopSplitDataset
from vlprompt.synthetic.descriptions import class_descriptions
from vlprompt.synthetic.downstream import SETS, ensure_dataset


class _SyntheticSet(CoopSplitDataset):
    """A set of ``vlprompt.synthetic.downstream.SETS``, named like the subclass; its split
    file and layout come from the set's spec, and its class descriptions (TAC) are generated from
    the spec's attributes into ``<folder>_prompt.json`` on first use."""

    template = "a photo of a {}."
    image_folder = "images"
    required_paths = ("images",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = SETS[cls.__name__]
        cls.split_file = spec.split_file
        cls.description_stem = spec.folder  # the descriptions are written on first use
        register_generated_descriptions(cls.__name__, partial(class_descriptions, spec))
        cls.layout = (f"{cls.dataset_dir}/\n  images/<class>/<split>_<n>.png\n  {cls.split_file}\n"
                      "  synthetic.json\n  (rendered on first use)")

    def __init__(self, cfg):
        ensure_dataset(cfg.DATASET.ROOT, SETS[type(self).__name__])
        super().__init__(cfg)

    def build_split(self):
        raise DatasetLayoutError(
            f"{self.split_path} is missing, so the synthetic set in {self.dataset_dir} is "
            "incomplete. Delete that folder; it is rendered again on the next run."
        )


@DATASET_REGISTRY.register()
class SyntheticShapes(_SyntheticSet):
    dataset_dir = "synthetic_shapes"


@DATASET_REGISTRY.register()
class SyntheticPatterns(_SyntheticSet):
    dataset_dir = "synthetic_patterns"


@DATASET_REGISTRY.register()
class SyntheticShapesV2(_SyntheticSet):
    dataset_dir = "synthetic_shapes_v2"


@DATASET_REGISTRY.register()
class SyntheticShapesSketch(_SyntheticSet):
    dataset_dir = "synthetic_shapes_sketch"


@DATASET_REGISTRY.register()
class SyntheticScenes(_SyntheticSet):
    dataset_dir = "synthetic_scenes"
