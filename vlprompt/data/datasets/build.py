"""The dataset registry and `build_dataset` (Dassl's names)."""
from vlprompt.utils import Registry, check_availability

DATASET_REGISTRY = Registry("DATASET")


def build_dataset(cfg):
    """Instantiate the dataset class registered under cfg.DATASET.NAME.

    Raises:
        ValueError: the name is not registered (the message lists the registered
            names and the most similar one), or no dataset is registered at all.
    """
    name = cfg.DATASET.NAME
    available = DATASET_REGISTRY.registered_names()
    if not available:
        raise ValueError(
            f'Cannot build dataset "{name}": no dataset is registered. Dataset classes register '
            "themselves when their module is imported; import the project's `datasets` package "
            "(train.py does) or your own dataset module first."
        )
    check_availability(name, available)
    if cfg.VERBOSE:
        print(f"Loading dataset: {name}")
    return DATASET_REGISTRY.get(name)(cfg)
