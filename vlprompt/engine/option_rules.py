"""Method options whose value ``auto`` is chosen by the run: :class:`ScopeRule` and :class:`DatasetRule`.

A method declares such an option once, beside its config defaults, and reads it through the rule:

* :class:`ScopeRule`: ``auto`` picks one value per evaluation scope (base, new, source, target;
  :mod:`vlprompt.engine.eval_scope`), e.g. the inference head of DeAR, MMRL or DePT;
* :class:`DatasetRule`: ``auto`` reads a per-dataset table by DATASET.NAME, e.g. MMRL's
  regularisation weight or TCP's templates; a rule may also hold a per-dataset value that no
  option sets (ProGrad's templates).

Any other value is used as given (an explicit value always wins). A numeric option may default
to ``auto``: the config merge (:mod:`vlprompt.config.merge`) lets a number replace ``auto`` and
``auto`` replace a number.
"""
from typing import Any, Mapping, Sequence

from vlprompt.config import ConfigError
from vlprompt.config.merge import AUTO  # the merge lets a number replace it

from .eval_scope import EVAL_SCOPES, check_eval_scope

__all__ = ["AUTO", "ScopeRule", "DatasetRule"]

_REQUIRED = object()


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class ScopeRule:
    """A method option whose value ``auto`` follows the evaluation scope.

    Example (DeAR): ``ScopeRule("TRAINER.DEAR.INFERENCE", base="fusion", new="fusion",
    source="fusion", target="cls")``; ``rule.resolve(node.INFERENCE, trainer.eval_scope)``
    gives "cls" for ``auto`` on a target dataset and the configured value otherwise.

    Args:
        key: the dotted config key (named in messages).
        **by_scope: the value of ``auto`` for each of EVAL_SCOPES (all four required).
    """

    def __init__(self, key, **by_scope):
        missing, unknown = set(EVAL_SCOPES) - set(by_scope), set(by_scope) - set(EVAL_SCOPES)
        if missing or unknown:
            raise ValueError(f"ScopeRule {key} needs one value for each of {EVAL_SCOPES}; "
                             f"missing {sorted(missing)}, unknown {sorted(unknown)}")
        self.key = key
        self.by_scope = dict(by_scope)

    @property
    def choices(self):
        """``auto`` and the values the rule can give, in scope order."""
        return (AUTO,) + tuple(dict.fromkeys(self.by_scope[scope] for scope in EVAL_SCOPES))

    def check(self, value):
        """Raise ConfigError unless ``value`` is one of :attr:`choices`."""
        if value not in self.choices:
            raise ConfigError(f"{self.key} must be one of {list(self.choices)}, got {value!r} "
                              f"({AUTO}: {self.describe_auto()}).")

    def resolve(self, value, scope):
        """The value to use: ``by_scope[scope]`` for ``auto``, else ``value`` itself."""
        self.check(value)
        check_eval_scope(scope)
        if not scope:
            raise ValueError(f"{self.key}: resolving needs an evaluation scope, one of {EVAL_SCOPES}")
        return self.by_scope[scope] if value == AUTO else value

    def describe_auto(self):
        """E.g. "base fusion, new fusion, source fusion, target cls"."""
        return ", ".join(f"{scope} {self.by_scope[scope]}" for scope in EVAL_SCOPES)

    def describe(self, value, scope):
        """One log line: what the option resolves to for ``scope`` and why."""
        why = f"{AUTO} for the {scope} scope" if value == AUTO else f"set explicitly; evaluation scope {scope}"
        return f"{self.key}: {self.resolve(value, scope)} ({why})"


class DatasetRule:
    """A per-dataset value of a method, read from its table by DATASET.NAME.

    Every per-dataset table of a method is one (the method file declares it at module level, so
    that ``tools/dataset_matrix.py`` lists it against every dataset). Two kinds:

    * an option's ``auto`` (``option=True``, the default): ``key`` is a config key whose value
      ``auto`` reads the table; any other value is used as given. Example (PromptKD):
      ``DatasetRule("TRAINER.PROMPTKD.KD_WEIGHT", KD_WEIGHTS, source="trainers.promptkd.KD_WEIGHTS")``;
      ``rule.resolve(node.KD_WEIGHT, cfg.DATASET.NAME)`` gives the table's weight of the dataset for
      ``auto`` and the configured value otherwise;
    * a value with no config option (``option=False``): ``key`` names it (e.g. "ProGrad's template")
      and :meth:`lookup` reads it.

    Args:
        key: the dotted config key, or the value's name when ``option`` is False (named in messages).
        table: DATASET.NAME -> the value for that dataset.
        default: the value for a dataset missing from the table; without it such a dataset is a
            ConfigError naming the key, the dataset and the datasets of the table.
        source: where the table is written (named in messages), e.g. "trainers.tcp.TCP_TEMPLATES".
        hint: a sentence added to the message of a missing dataset (e.g. what a value looks like).
        option: False for a value that no config key sets.
        fallback: the dataset-class attribute that a dataset missing from the table takes instead of
            ``default`` (e.g. "template": the dataset's own sentence) when its value is passed as
            ``own``; a reader that passes none gets ``default`` (e.g. "", filled in later).
        scopes: the evaluation scopes (:mod:`vlprompt.engine.eval_scope`) in which the method reads
            the rule (default: all), e.g. MMRL++'s two tables of β, one for targets.
    """

    def __init__(self, key: str, table: Mapping[str, Any], default: Any = _REQUIRED, source: str = "",
                 hint: str = "", *, option: bool = True, fallback: str = "", scopes: Sequence[str] = EVAL_SCOPES):
        if AUTO in table:
            raise ValueError(f"DatasetRule {key}: {AUTO!r} cannot be a dataset name of the table.")
        unknown = set(scopes) - set(EVAL_SCOPES)
        if not scopes or unknown:
            raise ValueError(f"DatasetRule {key}: scopes must be some of {EVAL_SCOPES}, got {list(scopes)}.")
        if fallback and default is _REQUIRED:
            raise ValueError(f"DatasetRule {key}: a fallback ({fallback!r}) needs a default for readers "
                             "that do not pass the dataset's own value.")
        self.key = key
        self.table = dict(table)
        self.default = default
        self.source = source or "its per-dataset table"
        self.hint = hint
        self.option = option
        self.fallback = fallback
        self.scopes = tuple(scope for scope in EVAL_SCOPES if scope in scopes)

    @property
    def has_default(self) -> bool:
        return self.default is not _REQUIRED

    def lookup(self, dataset: str, own: Any = None):
        """The table's value of ``dataset``; for a dataset missing from it ``own`` (the dataset's value
        of :attr:`fallback`, when the rule has one and it is given), else the default.

        Raises:
            ConfigError: ``dataset`` is not in the table and the rule has no default.
        """
        if dataset in self.table:
            return self.table[dataset]
        if self.fallback and own is not None:
            return own
        if self.has_default:
            return self.default
        entries = f"which has no entry for {dataset!r} (it has {', '.join(self.table)})"
        if not self.option:
            raise ConfigError(f"{self.key} is read from {self.source} by DATASET.NAME, {entries}; add one "
                              f"there. {self.hint}".strip())
        raise ConfigError(
            f"{self.key} is {AUTO!r}: its value is read from {self.source} by DATASET.NAME, {entries}; "
            f"set {self.key} explicitly. {self.hint}".strip()
        )

    def resolve(self, value, dataset: str, own: Any = None):
        """The value to use: :meth:`lookup` of ``dataset`` for ``auto``, else ``value`` itself.

        Raises:
            ConfigError: see :meth:`lookup`; or the table holds numbers and ``value`` is neither
                ``auto`` nor a number.
        """
        if value == AUTO:
            return self.lookup(dataset, own)
        if self.table and all(map(_is_number, self.table.values())) and not _is_number(value):
            raise ConfigError(f"{self.key} must be {AUTO!r} (read from {self.source} by DATASET.NAME) "
                              f"or a number, got {value!r}.")
        return value

    def describe(self, value, dataset: str, own: Any = None) -> str:
        """One log line: what the option resolves to for ``dataset`` and why."""
        if value != AUTO:
            return f"{self.key}: {value!r} (set explicitly)"
        how = f"{AUTO}: " if self.option else ""
        if dataset in self.table:
            why = f"from {self.source} for {dataset}"
        elif self.fallback and own is not None:
            why = f"{dataset}'s own {self.fallback}; {self.source} has no entry for it"
        else:
            why = f"the default of {self.source} for {dataset}"
        return f"{self.key}: {self.lookup(dataset, own)!r} ({how}{why})"
