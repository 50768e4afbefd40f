"""Merging YAML files and command-line overrides into a config, with readable errors.

The merge follows yacs's rules (``CfgNode.merge_from_other_cfg`` / ``merge_from_list``; a file is
merged here without yacs's copy of every subtree at every level, with the same result):
every key must exist, string values are literal-evaluated, int and float do not mix,
list and tuple convert into each other; a number may replace the string ``auto`` and ``auto`` a
number (options whose ``auto`` a rule resolves, :mod:`vlprompt.engine.option_rules`). Before
merging, the input is checked with yacs's own decoding and type rules, and any failure becomes
one :class:`ConfigError` paragraph naming the key, where it came from, and what would be accepted.

Inheritance: a config file may name a base config at its top level,
``_BASE_: ../_base_/clip.yaml``, whose path is relative to the folder of the file that names
it (an absolute path also works). Bases chain to any depth; the base is merged first, so the
child's values override it, key by key (a list replaces the base's list, it is not appended
to). Every file of the chain is checked before anything is merged, and an error names the
file the bad key or value came from.
"""
import copy
import difflib
import functools
import os.path as osp

import yaml
from yacs.config import _VALID_TYPES, CfgNode, _check_and_coerce_cfg_value_type

__all__ = ["ConfigError", "config_chain", "dump_cfg", "merge_from_file", "merge_from_list", "looks_like_option",
           "load_yaml"]

COMMAND_LINE = "command line"
BASE_KEY = "_BASE_"
AUTO = "auto"  # the value of an option a rule resolves (vlprompt.engine.option_rules)


class ConfigError(ValueError):
    """A config file or override that cannot be merged (unknown key, wrong type, ...)."""


def _type_name(value_or_type):
    kind = value_or_type if isinstance(value_or_type, type) else type(value_or_type)
    if issubclass(kind, CfgNode):
        return "group of keys (mapping)"
    if kind in (list, tuple):
        return "list or tuple"
    if kind is type(None):
        return "None"
    return kind.__name__


def _all_keys(cfg, prefix=""):
    """Every dotted key of ``cfg``, groups included, in definition order."""
    keys = []
    for name, value in cfg.items():
        full_key = prefix + name
        keys.append(full_key)
        if isinstance(value, CfgNode):
            keys.extend(_all_keys(value, full_key + "."))
    return keys


def _closest_keys(full_key, cfg, limit=4):
    """Existing keys at the same depth as ``full_key``: those with the same last
    component first, then difflib's closest matches."""
    depth = full_key.count(".")
    existing = [key for key in _all_keys(cfg) if key.count(".") == depth]
    leaf = full_key.split(".")[-1]
    same_leaf = [key for key in existing if key.split(".")[-1] == leaf]
    similar = difflib.get_close_matches(full_key, existing, n=limit, cutoff=0.6)
    return list(dict.fromkeys(same_leaf + similar))[:limit]


def _unknown_key_error(cfg, full_key, source):
    closest = _closest_keys(full_key, cfg)
    if closest:
        suggestion = "Closest existing keys: " + ", ".join(closest) + "."
    else:
        suggestion = "No existing key is similar."
    hint = ""
    parts = full_key.split(".")
    if parts[0] == "TRAINER" and len(parts) > 1 and parts[1] not in cfg.TRAINER:
        hint = (
            f" Nodes under TRAINER (e.g. TRAINER.{parts[1]}) are added by their trainer module: "
            "import it so it registers its extension, and call extend_cfg(cfg) before merging."
        )
    if parts[-1] == BASE_KEY:
        hint = f" {BASE_KEY} (the base config's path) is only read at the top level of a config file."
    return ConfigError(
        f'Unknown config key "{full_key}" (from {source}). Every key must already exist in the '
        f"defaults or in a trainer's node. {suggestion}{hint}"
    )


def _type_hint(expected, given):
    """A short fix for the common mismatches, or ""."""
    expected_type, given_type = type(expected), type(given)
    if expected_type is float and given_type is int:
        return f" Write {given}.0 instead of {given}."
    if expected_type is int and given_type is float:
        if given.is_integer():
            return f" Write {int(given)} instead of {given}."
        return " This key takes a whole number."
    if expected_type is bool:
        return " Write True or False."
    if expected_type in (list, tuple) and not isinstance(given, (list, tuple)):
        return f" Write a list such as [{given!r}] or a tuple such as ({given!r},)."
    if expected_type is str:
        return f" Quote the value to keep it a string, e.g. '\"{given}\"'."
    if expected_type is CfgNode:
        return " This key is a group: give a mapping of its sub-keys."
    if given_type is CfgNode:
        return " This key takes a single value, not a mapping."
    return ""


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _auto_or_number(expected, decoded):
    """Whether ``decoded`` replaces ``expected`` across the ``auto`` / number line (either way)."""
    return (expected == AUTO and _is_number(decoded)) or (_is_number(expected) and decoded == AUTO)


def _decode(value):
    """``value`` as yacs decodes a raw value (a string literal-evaluated, a mapping made a group of
    keys), without yacs's copy of a group that is one already: the callers only read what it returns,
    or store an immutable number or ``auto``."""
    if isinstance(value, CfgNode):
        return value
    return CfgNode._decode_cfg_value(value)


def _checked_value(expected, value, full_key, source):
    """Decode ``value`` like yacs and return it coerced to the type of ``expected``."""
    decoded = _decode(value)
    if _auto_or_number(expected, decoded):
        return decoded
    try:
        return _check_and_coerce_cfg_value_type(decoded, expected, full_key.split(".")[-1], full_key)
    except ValueError:
        if isinstance(expected, CfgNode):
            expectation = f"a group of keys ({', '.join(expected.keys())})"
        else:
            expectation = f"{_type_name(expected)} like the default {expected!r}"
        shown_value = dict(decoded) if isinstance(decoded, CfgNode) else decoded
        raise ConfigError(
            f'Wrong type for config key "{full_key}" (from {source}): expected {expectation}, '
            f"but got {shown_value!r} ({_type_name(decoded)}).{_type_hint(expected, decoded)}"
        ) from None


def _check_node(cfg, node, other, prefix, source):
    """Check that every key of ``other`` exists in ``node`` with a compatible type."""
    for name, value in other.items():
        full_key = prefix + name
        if name not in node:
            if node.is_new_allowed():
                continue
            raise _unknown_key_error(cfg, full_key, source)
        checked = _checked_value(node[name], value, full_key, source)
        if isinstance(checked, CfgNode):
            _check_node(cfg, node[name], checked, full_key + ".", source)


def _assign_auto_or_number(cfg, other):
    """Set the keys of ``other`` that cross the ``auto`` / number line directly in ``cfg``, so that
    yacs's merge, which does not allow that change of type, then finds equal types."""
    for name, value in other.items():
        if name not in cfg:
            continue
        decoded = _decode(value)
        if isinstance(cfg[name], CfgNode) and isinstance(decoded, CfgNode):
            _assign_auto_or_number(cfg[name], decoded)
        elif _auto_or_number(cfg[name], decoded):
            cfg[name] = decoded


def _lookup(cfg, full_key, source):
    """The current value of the dotted key ``full_key`` (ConfigError if it does not exist)."""
    node = cfg
    for name in full_key.split("."):
        if not isinstance(node, CfgNode) or name not in node:
            raise _unknown_key_error(cfg, full_key, source)
        node = node[name]
    return node


def load_yaml(text):
    """The data of the YAML document ``text``, as ``yaml.safe_load`` reads it, on libyaml's parser
    where PyYAML has it (the same constructor and resolver, several times faster: every trainer
    build reads its config files and a run's config.yaml).

    Raises:
        yaml.YAMLError: the pure-Python parser's error (its message shows the line).
    """
    if not hasattr(yaml, "CSafeLoader"):  # PyYAML built without libyaml
        return yaml.safe_load(text)
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return yaml.safe_load(text)


@functools.lru_cache(maxsize=128)
def _parsed(text):
    """``load_yaml(text)``, kept for the next file of the same text (a trainer build reads the files
    of its config again, a run's ``config.yaml`` several times); read-only: :func:`_tree` copies."""
    return load_yaml(text)


def _plain(node, keys=()):
    """``node`` (a CfgNode) as the plain data yacs's ``dump`` writes, or None when a key or a string in
    it is not printable ASCII (or a value is of a type yacs refuses to dump)."""
    data = {}
    for key, value in node.items():
        if isinstance(value, CfgNode):
            value = _plain(value, keys + (key,))
            if value is None:
                return None
        elif type(value) not in _VALID_TYPES or not _simple_strings(value):
            return None
        if not _simple_strings(key):
            return None
        data[key] = value
    return data


def _simple_strings(value):
    """Whether every string of ``value`` (a leaf, or a list or tuple of them) is printable ASCII."""
    if isinstance(value, str):
        return value.isascii() and value.isprintable()
    if isinstance(value, (list, tuple)):
        return all(_simple_strings(item) for item in value)
    return not isinstance(value, dict)


def dump_cfg(cfg):
    """The YAML text of ``cfg``, equal to yacs's ``cfg.dump()``, which writes with PyYAML's
    pure-Python emitter: with libyaml's emitter where PyYAML has it and every key and string of the
    config is printable ASCII (the two emitters differ only in how they fold long escaped strings),
    several times faster (a run writes its ``config.yaml``, an export its config)."""
    data = _plain(cfg) if hasattr(yaml, "CSafeDumper") else None
    if data is None:
        return cfg.dump()
    return yaml.dump(data, Dumper=yaml.CSafeDumper)


def _read_yaml(path):
    """The top-level mapping of a YAML config file, with readable errors; the caller must not
    change it (it is kept for the next read of the same text)."""
    with open(path, "r", encoding="utf-8") as f:
        try:
            data = _parsed(f.read())
        except yaml.YAMLError as error:
            detail = " ".join(str(error).split())
            raise ConfigError(f'Config file "{path}" is not valid YAML: {detail}') from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f'Config file "{path}" must hold a mapping of KEY: VALUE entries at the top level, '
            f"but holds a {type(data).__name__}"
        )
    return data


def _tree(data, keys=()):
    """``data`` (a mapping read from YAML) as the CfgNode that ``CfgNode(data)`` builds, without
    yacs's copy of every subtree at every level and its error message formatted for every leaf:
    mappings become groups, a list is copied (as yacs copies it), other leaves are kept.

    Raises:
        AssertionError: a leaf of a type a config cannot store, with yacs's message.
    """
    node = CfgNode()
    for key, value in data.items():
        if isinstance(value, dict):
            value = _tree(value, keys + (key,))
        elif type(value) not in _VALID_TYPES:
            dotted = ".".join(keys + (str(key),))
            raise AssertionError(f"Key {dotted} with value {type(value)} is not a valid type; "
                                 f"valid types: {_VALID_TYPES}")
        elif isinstance(value, list):
            value = copy.deepcopy(value)
        dict.__setitem__(node, key, value)
    return node


def _to_node(data, path):
    """``data`` as a CfgNode (as yacs reads a file)."""
    try:
        return _tree(data)
    except AssertionError as error:
        raise ConfigError(f'Config file "{path}" holds a value that a config cannot store: {error}') from None


def _check_exists(path):
    if not osp.isfile(path):
        raise ConfigError(
            f'Config file "{path}" does not exist (looked for "{osp.abspath(path)}"). Relative config '
            "paths are read from the current directory: give them relative to the repository root "
            "and run from there, or give an absolute path."
        )


def _arrow(paths):
    return " -> ".join(f'"{path}"' for path in paths)


def _base_of(path, base, chain):
    """The path of the base config that ``path`` names with ``_BASE_: base``."""
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(
            f'Config file "{path}" has {BASE_KEY}: {base!r} ({_type_name(base)}), but {BASE_KEY} must be the '
            "path of a base config file (a string, relative to the folder of the file that names it)."
        )
    base_path = osp.normpath(osp.join(osp.dirname(path), base))
    if not osp.isfile(base_path):
        raise ConfigError(
            f'Config file "{path}" names {BASE_KEY}: "{base}", which does not exist (looked for '
            f'"{osp.abspath(base_path)}"; {BASE_KEY} paths are relative to the folder of the file that names '
            f"them). Chain: {_arrow(chain + [base_path])}."
        )
    return base_path


def config_chain(path):
    """The files that make up the config file ``path``, following ``_BASE_`` (module docstring).

    Returns:
        ``[(file, node), ...]`` base first and ``path`` last; each node is that file's own
        keys as a CfgNode, without ``_BASE_``. Files are named as given (``path``) or as
        joined from their child's folder.

    Raises:
        ConfigError: a missing or unreadable file, a ``_BASE_`` that is not a path string,
            or a cycle (every message names the files of the chain).
    """
    _check_exists(path)
    chain, nodes, seen = [], [], set()
    current = path
    while current is not None:
        chain.append(current)
        real = osp.realpath(current)
        if real in seen:
            raise ConfigError(f'Config file "{path}" inherits from itself through {BASE_KEY}: {_arrow(chain)}.')
        seen.add(real)
        data = _read_yaml(current)
        has_base = BASE_KEY in data
        base = data.get(BASE_KEY)
        nodes.append(_to_node({key: value for key, value in data.items() if key != BASE_KEY}, current))
        current = _base_of(current, base, chain) if has_base else None
    return list(zip(chain, nodes))[::-1]


def _file_source(file, files):
    """How an error names ``file``, one of ``files`` (a chain, base first)."""
    if len(files) == 1:
        return f'config file "{file}"'
    return f'config file "{file}", in the {BASE_KEY} chain {_arrow(files[::-1])}'


def merge_from_file(cfg, path):
    """Merge the YAML file ``path`` and its ``_BASE_`` chain into ``cfg`` (yacs semantics;
    bases first, so the child overrides).

    Raises:
        ConfigError: missing or unreadable file, bad ``_BASE_``, unknown key, or wrong value
            type; nothing is merged then.
    """
    chain = config_chain(path)
    files = [file for file, _ in chain]
    for file, node in chain:
        _check_node(cfg, cfg, node, "", _file_source(file, files))
    for _, node in chain:
        _merge_checked(cfg, node, "")


def _merge_checked(cfg, other, prefix):
    """Merge the checked node ``other`` (of :func:`config_chain`, read by this module and held by no
    one else) into ``cfg``, as ``_assign_auto_or_number`` then yacs's ``merge_from_other_cfg`` do,
    without yacs's copy of every value at every level (a config merge was mostly copying).

    Raises:
        ValueError: yacs's type mismatch, of a file whose value does not fit a value of a file
            merged before it (the check compared both with the defaults).
    """
    for name, value in other.items():
        decoded = _decode(value)
        if name not in cfg:  # a group that allows new keys (the check let it through)
            cfg[name] = decoded
            continue
        original = cfg[name]
        if not _auto_or_number(original, decoded):
            decoded = _check_and_coerce_cfg_value_type(decoded, original, name, prefix + name)
        if isinstance(decoded, CfgNode):
            _merge_checked(original, decoded, prefix + name + ".")
        else:
            cfg[name] = decoded


OPTIONS_FIRST = (
    "Options must come before the KEY VALUE overrides: everything after the first KEY is read as "
    "KEY VALUE pairs (e.g. python train.py --output-dir X ... DATASET.NUM_SHOTS 16)."
)


def looks_like_option(item):
    """Whether a command-line item is an option such as ``--output-dir`` or ``-h`` (not ``-1``)."""
    return len(item) > 1 and item[0] == "-" and (item[1].isalpha() or (item[1] == "-" and item[2:3].isalpha()))


def merge_from_list(cfg, opts):
    """Merge ``[KEY1, VALUE1, KEY2, VALUE2, ...]`` into ``cfg`` (yacs semantics: values
    are literal-evaluated strings, e.g. "16" -> 16, "False" -> False, "base" -> "base").

    Raises:
        ConfigError: odd number of items, unknown key (an item that looks like a command-line
            option is named as such), or wrong value type.
    """
    opts = list(opts)
    options = [item for item in opts if looks_like_option(item)]
    if len(opts) % 2 != 0:
        hint = (f" {options[0]} looks like a command-line option: {OPTIONS_FIRST}" if options else
                " Check for a key without a value, or a value with spaces that the shell split (quote it).")
        raise ConfigError(
            f"Command-line overrides must be KEY VALUE pairs, but got an odd number of items "
            f"({len(opts)}): {opts}.{hint}"
        )
    for full_key in opts[0::2]:
        if looks_like_option(full_key):
            raise ConfigError(f'"{full_key}" is not a config key: it looks like a command-line option. {OPTIONS_FIRST}')
    for full_key, value in zip(opts[0::2], opts[1::2]):
        _checked_value(_lookup(cfg, full_key, COMMAND_LINE), value, full_key, COMMAND_LINE)
        *parents, name = full_key.split(".")
        _assign_auto_or_number(_lookup(cfg, ".".join(parents), COMMAND_LINE) if parents else cfg, {name: value})
    cfg.merge_from_list(opts)
