"""Value checks for trainers' ``check_cfg``: one clear ConfigError per bad value.

yacs already checks that a key exists and has the right type; these helpers check what
a method needs on top of that (allowed choices, ranges), before any data is loaded.
"""
from .merge import ConfigError

__all__ = ["check_choice", "check_range"]


def check_choice(key, value, choices):
    """Raise ConfigError unless ``value`` is one of ``choices``.

    Args:
        key: dotted config key, e.g. "TRAINER.IVLP.PREC" (named in the message).
        value: the configured value.
        choices: the accepted values.
    """
    if value not in choices:
        raise ConfigError(f"{key} must be one of {list(choices)}, got {value!r}.")


def check_range(key, value, minimum=None, maximum=None, why=""):
    """Raise ConfigError unless ``minimum <= value <= maximum`` (None: no bound).

    Args:
        key: dotted config key named in the message.
        value: the configured number.
        minimum, maximum: inclusive bounds.
        why: a sentence appended to the message (e.g. where the bound comes from).
    """
    too_small = minimum is not None and value < minimum
    too_large = maximum is not None and value > maximum
    if not (too_small or too_large):
        return
    if minimum is not None and maximum is not None:
        expected = f"between {minimum} and {maximum}"
    elif minimum is not None:
        expected = f"at least {minimum}"
    else:
        expected = f"at most {maximum}"
    message = f"{key} must be {expected}, got {value!r}."
    raise ConfigError(f"{message} {why}".strip())
