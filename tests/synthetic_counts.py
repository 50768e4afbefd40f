"""Synthetic sets rendered with fewer images per class while a test module's in-process runs read them."""
import contextlib
import dataclasses

import pytest

from vlprompt.synthetic.downstream import SETS


@contextlib.contextmanager
def smaller_sets(counts):
    """Inside the block, each set ``name`` of ``counts`` is rendered with ``counts[name]`` = (train,
    validation, test) images per class; its classes, style and seed are unchanged."""
    with pytest.MonkeyPatch.context() as patch:
        for name, per_class in counts.items():
            patch.setitem(SETS, name, dataclasses.replace(SETS[name], counts=per_class))
        yield
