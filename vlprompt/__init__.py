from .version import __version__

__all__ = ["__version__", "load_classifier"]


def load_classifier(path, weights=None, device="cpu", batch_size=64):
    """An exported classifier file with a class-text-feature head, loaded with the library alone
    (:func:`vlprompt.export.load_classifier`; importing ``vlprompt`` stays free of torch)."""
    from vlprompt.export import load_classifier as load

    return load(path, weights, device, batch_size)
