"""The synthetic benchmark's datasets (rendered into DATASET.ROOT on first use).

Not a real-image benchmark: procedurally drawn 32x32 objects (vlprompt.synthetic) that
let every method and protocol run offline on a CPU with the project's tiny CLIP.

* SyntheticShapes: 80 colour-shape classes ("red star"); base = first 40 labels.
* SyntheticPatterns: 40 texture-shape classes ("striped star"), cross-dataset target.
* SyntheticShapesV2, SyntheticShapesSketch: test-only re-renderings of SyntheticShapes
  (smaller objects; coloured outlines on paper), the domain-generalisation targets.

Once written, a set is an ordinary CoOp-layout dataset read through
``prepare_coop_splits``; the few-shot caches go to its ``split_fewshot/``.
"""
import os

from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, DatasetLayoutError
from vlprompt.data.splits import prepare_coop_splits
from vlprompt.synthetic.downstream import SETS, ensure_dataset


class _SyntheticSet(DatasetBase):
    """A set of ``vlprompt.synthetic.downstream.SETS``, named like the subclass."""

    template = "a photo of a {}."

    def __init__(self, cfg):
        spec = SETS[type(self).__name__]
        ensure_dataset(cfg.DATASET.ROOT, spec)
        self.find_dataset_dir(cfg, required=["images"])
        self.image_dir = os.path.join(self.dataset_dir, "images")
        self.split_path = os.path.join(self.dataset_dir, spec.split_file)

        def missing_split():
            raise DatasetLayoutError(
                f"{self.split_path} is missing, so the synthetic set in {self.dataset_dir} is "
                "incomplete. Delete that folder; it is rendered again on the next run."
            )

        train, val, test = prepare_coop_splits(cfg, self.dataset_dir, missing_split, self.split_path, self.image_dir)
        super().__init__(train_x=train, val=val, test=test)


def _layout(folder, name):
    return f"{folder}/\n  images/<class>/<split>_<n>.png\n  split_zhou_{name}.json\n  synthetic.json\n  (rendered on first use)"


@DATASET_REGISTRY.register()
class SyntheticShapes(_SyntheticSet):
    dataset_dir = "synthetic_shapes"
    layout = _layout(dataset_dir, "SyntheticShapes")


@DATASET_REGISTRY.register()
class SyntheticPatterns(_SyntheticSet):
    dataset_dir = "synthetic_patterns"
    layout = _layout(dataset_dir, "SyntheticPatterns")


@DATASET_REGISTRY.register()
class SyntheticShapesV2(_SyntheticSet):
    dataset_dir = "synthetic_shapes_v2"
    layout = _layout(dataset_dir, "SyntheticShapesV2")


@DATASET_REGISTRY.register()
class SyntheticShapesSketch(_SyntheticSet):
    dataset_dir = "synthetic_shapes_sketch"
    layout = _layout(dataset_dir, "SyntheticShapesSketch")
