"""open_clip without Hugging Face ``transformers`` until a model needs it.

``open_clip.hf_model`` and ``open_clip.coca_model`` (imported by ``import open_clip``) import
``transformers`` for Hugging Face text towers and CoCa's caption generation, and importing
``transformers`` scans its whole package (about 1.2 s of CPU per process here, a seventh of
``import open_clip``), although only models whose ``text_cfg`` names an ``hf_model_name`` use
it here. ``defer_transformers`` (called when ``vlprompt.clip`` is imported) makes those modules'
imports see no ``transformers`` when ``transformers`` is not imported yet, so they take
open_clip's own "not installed" branches;
``enable_hf_text_towers`` (called by :func:`vlprompt.clip.load_clip` before it builds a model
with such a text tower) imports ``transformers`` and executes ``open_clip.hf_model`` again in
its own namespace, which the classes open_clip already imported from it read their globals from.
A process that imported ``transformers`` before open_clip is left as it is, and so are
Hugging Face tokenizers, which import ``transformers`` when they are built.
"""
import importlib
import importlib.abc
import sys

__all__ = ["defer_transformers", "enable_hf_text_towers"]

HF_MODULE = "open_clip.hf_model"
# open_clip's modules that import transformers when they are imported.
DEFERRED_MODULES = (HF_MODULE, "open_clip.coca_model")


class _TransformersHidden(importlib.abc.Loader):
    """Executes a module with ``transformers`` marked as not importable."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        sys.modules["transformers"] = None  # `import transformers` raises ImportError
        try:
            self.loader.exec_module(module)
        finally:
            if sys.modules.get("transformers", False) is None:
                del sys.modules["transformers"]


class _DeferTransformers(importlib.abc.MetaPathFinder):
    """Finds DEFERRED_MODULES with :class:`_TransformersHidden` while ``transformers`` is not imported."""

    def find_spec(self, name, path, target=None):
        if name not in DEFERRED_MODULES or "transformers" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _TransformersHidden(spec.loader)
        return spec


def defer_transformers():
    """Install the deferral once (no effect on an open_clip imported already)."""
    if not any(isinstance(finder, _DeferTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DeferTransformers())


def enable_hf_text_towers():
    """Give ``open_clip.hf_model`` the ``transformers`` it was imported without (no-op when it has it
    or ``transformers`` is not installed: open_clip then says to install it)."""
    import open_clip.hf_model as hf_model

    if hf_model.transformers is not None:
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        return
    importlib.reload(hf_model)
