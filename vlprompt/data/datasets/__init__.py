from .base_dataset import DatasetBase, DatasetLayoutError, Datum, MissingImagesError
from .build import DATASET_REGISTRY, build_dataset

__all__ = [
    "DATASET_REGISTRY",
    "Datum",
    "DatasetBase",
    "DatasetLayoutError",
    "MissingImagesError",
    "build_dataset",
]
