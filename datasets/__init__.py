"""The project's dataset classes (one module per dataset).

Importing this package imports every dataset module, which registers each
class in vlprompt's DATASET_REGISTRY under its class name.
"""
from . import dtd, eurosat, oxford_pets  # noqa: F401  (imported for registration)
from . import (  # noqa: F401  (imported for registration)
    caltech101, fgvc_aircraft, food101, imagenet, imagenet_a, imagenet_r, imagenet_sketch, imagenetv2,
    objectnet, oxford_flowers, stanford_cars, sun397, ucf101,
)
from . import image_folder, synthetic  # noqa: F401  (imported for registration)
