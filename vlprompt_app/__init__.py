"""The application layer: what sits above the methods (``trainers/``) and datasets (``datasets/``).

``vlprompt`` is the library (config, data, engine, CLIP runner, interpretation, synthetic
world) and imports nothing above it. ``trainers/`` and ``datasets/`` build on the library.
This package builds on all three: protocol grids and their execution, the results reader and
tables, benchmarks, the comparison with official code, and the main functions of
``train.py`` and the scripts under ``tools/``, which are thin command lines over it.
``vlprompt_app.project`` loads ``trainers`` and ``datasets`` from the checkout.
"""
from vlprompt_app.predict import load_run  # noqa: E402  (predictions of a trained run: vlprompt_app/predict.py)

__all__ = ["load_run"]
