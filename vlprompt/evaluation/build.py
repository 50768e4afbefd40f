"""Evaluator registry and construction (Dassl ``build_evaluator``)."""
from vlprompt.utils import Registry, check_availability

__all__ = ["EVALUATOR_REGISTRY", "build_evaluator"]

EVALUATOR_REGISTRY = Registry("EVALUATOR")


def build_evaluator(cfg, **kwargs):
    """Instantiate the evaluator named by ``cfg.TEST.EVALUATOR`` as ``cls(cfg, **kwargs)``.

    Prints "Loading evaluator: NAME" when ``cfg.VERBOSE``.
    """
    name = cfg.TEST.EVALUATOR
    check_availability(name, EVALUATOR_REGISTRY.registered_names())
    if cfg.VERBOSE:
        print(f"Loading evaluator: {name}")
    return EVALUATOR_REGISTRY.get(name)(cfg, **kwargs)
