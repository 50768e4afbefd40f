"""The project's dataset classes (one module per dataset).

Importing this package imports every dataset module, which registers each
class in vlprompt's DATASET_REGISTRY under its class name.
"""
from . import dtd, eurosat, oxford_pets  # noqa: F401  (imported for registration)
