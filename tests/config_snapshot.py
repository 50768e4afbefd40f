"""The merged-config snapshot: every shipped config merged over the defaults, as plain data.

A config's *merged config* is what train.py builds from it: the defaults, every trainer's
``TRAINER.<NAME>`` node (``extend_cfg``; all trainers are registered, as in train.py), then
the file (``merge_from_file``). The snapshot (``tests/fixtures/merged_configs.json``) stores
it compactly and exactly:

* ``"defaults"``: the full default config (core keys and every trainer node), one dotted
  key per leaf, e.g. ``"OPTIM.LR": 0.0003``;
* ``"files"``: for every runnable config (``configs/trainers/**/*.yaml`` outside ``_base_``
  folders, and ``configs/datasets/*.yaml``), the merged value of every key the file sets.

A method added after the snapshot was taken is new, not changed: its ``TRAINER.<NODE>`` (a node
the snapshot's defaults have no key of, ``new_trainer_nodes``) and its configs (a folder
``configs/trainers/<M>/`` the snapshot has no config of, ``new_method_configs``) are not pinned
until the snapshot is next written, so a new method is its trainer file and its configs only.
A new key of a node the snapshot has, and a new config of a method it has, are still changes.

A file's merged config is ``defaults`` updated with its entry. Keys the file sets are stored
even where they equal the default, so that a later change of a trainer default does not
silently change a config that pinned the old value. Values are JSON: tuples become lists,
floats keep their exact repr, and ``1`` (int), ``1.0`` (float) and ``true`` stay distinct.

Write the snapshot, from the repository root (it overwrites the file)::

    python -m tests.config_snapshot

Do that only to fold the entries of ``tests/fixtures/merged_configs_changes.yaml`` into the
snapshot (then empty that file), never to make a failing snapshot test pass. To add the
configs that are not in the snapshot yet, leaving every stored entry as it is::

    python -m tests.config_snapshot --add-new
"""
import argparse
import json
import os
from pathlib import Path

import trainers  # noqa: F401  (registers every trainer's config node, as train.py does)
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file
from vlprompt.config.merge import config_chain

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "fixtures" / "merged_configs.json"
BASE_FOLDER = "_base_"  # folders of base configs (``_BASE_`` targets), never run on their own


def shipped_configs(root=ROOT):
    """Repository-relative POSIX paths of the runnable configs, sorted."""
    root = Path(root)
    paths = list(root.glob("configs/trainers/**/*.yaml")) + list(root.glob("configs/datasets/*.yaml"))
    relative = (path.relative_to(root) for path in paths)
    return sorted(path.as_posix() for path in relative if BASE_FOLDER not in path.parts)


def trainer_node(key):
    """``TRAINER.<NODE>`` of a dotted key under a trainer node, else None (``TRAINER.NAME``, core keys)."""
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "TRAINER" and len(parts) > 2 else None


def new_trainer_nodes(pinned_defaults, keys):
    """The trainer nodes of ``keys`` of which ``pinned_defaults`` (the snapshot's flat defaults) has no
    key: the nodes of methods added since the snapshot was taken."""
    pinned = {trainer_node(key) for key in pinned_defaults}
    return {trainer_node(key) for key in keys} - pinned - {None}


def method_folder(path):
    """``configs/trainers/<M>`` of a trainer config path, else None (dataset configs)."""
    parts = path.split("/")
    return "/".join(parts[:3]) if parts[:2] == ["configs", "trainers"] and len(parts) > 3 else None


def new_method_configs(snapshot_files, paths):
    """The configs among ``paths`` in a method folder of which ``snapshot_files`` has no config: the
    configs of methods added since the snapshot was taken (sorted)."""
    pinned = {method_folder(path) for path in snapshot_files}
    return sorted(path for path in paths if method_folder(path) is not None and method_folder(path) not in pinned)


def plain(value):
    """``value`` as JSON data: tuples (also nested) become lists."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def flatten(node, prefix=""):
    """``{dotted key: plain value}`` of every leaf of a CfgNode (or nested mapping)."""
    flat = {}
    for name, value in node.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{name}."))
        else:
            flat[prefix + name] = plain(value)
    return flat


def default_config():
    """The defaults with every registered trainer node, as train.py starts from."""
    cfg = get_cfg_default()
    extend_cfg(cfg)
    return cfg


def merged_config(relative_path, root=ROOT):
    """Flattened merged config of one config file (path relative to ``root``)."""
    cfg = default_config()
    merge_from_file(cfg, str(Path(root, relative_path)))
    return flatten(cfg)


def keys_set_by(relative_path, root=ROOT):
    """Dotted keys that the config file writes, itself or through its ``_BASE_`` chain."""
    return {key for _, node in config_chain(str(Path(root, relative_path))) for key in flatten(node)}


def file_entry(relative_path, root=ROOT):
    """The snapshot entry of one config: the merged value of each key the file sets."""
    merged = merged_config(relative_path, root)
    return {key: merged[key] for key in keys_set_by(relative_path, root)}


def build_snapshot(root=ROOT):
    """``{"defaults": {...}, "files": {path: {...}}}`` of today's configs (module docstring)."""
    return {
        "defaults": flatten(default_config()),
        "files": {path: file_entry(path, root) for path in shipped_configs(root)},
    }


def dumps(snapshot):
    """The snapshot as JSON text: keys sorted, one dotted key per line (readable diffs)."""

    def block(mapping, indent):
        lines = [f'{" " * indent}{json.dumps(key)}: {json.dumps(mapping[key])}' for key in sorted(mapping)]
        return ",\n".join(lines)

    files = ",\n".join(
        f'    {json.dumps(path)}: {{\n{block(entry, 6)}\n    }}' for path, entry in sorted(snapshot["files"].items())
    )
    return (
        "{\n"
        f'  "defaults": {{\n{block(snapshot["defaults"], 4)}\n  }},\n'
        f'  "files": {{\n{files}\n  }}\n'
        "}\n"
    )


def load_snapshot(path=SNAPSHOT):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class _Absent:
    """The value of a key that a config does not have."""

    def __repr__(self):
        return "<absent>"


ABSENT = _Absent()


class ChangeListError(ValueError):
    """A malformed entry in the list of intended changes."""


CHANGE_FIELDS = ("file", "key", "before", "after", "reason")


def load_changes(path):
    """The intended changes: a YAML list of ``{file, key, before, after, reason}`` mappings.

    ``file`` is a snapshot path or ``defaults``; ``before`` / ``after`` are written as in a
    config YAML (decoded the same way: ``1e-5`` is the float 1e-05, ``(0.5, 1.0)`` a list);
    leaving ``before`` out means the key did not exist, leaving ``after`` out that it no longer
    exists. Returns a list of dicts with ``before`` / ``after`` set to ABSENT where left out.

    Raises:
        ChangeListError: not a list, an entry with unknown or missing fields, or a value that
            is not a string where one is needed.
    """
    import yaml
    from yacs.config import CfgNode

    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f) or []
    if not isinstance(entries, list):
        raise ChangeListError(f"{path} must hold a YAML list of entries, got a {type(entries).__name__}.")
    changes = []
    for index, entry in enumerate(entries, 1):
        where = f"{path}, entry {index}"
        if not isinstance(entry, dict):
            raise ChangeListError(f"{where}: expected a mapping with {', '.join(CHANGE_FIELDS)}, got {entry!r}.")
        unknown = sorted(set(entry) - set(CHANGE_FIELDS))
        missing = [name for name in ("file", "key", "reason") if not entry.get(name)]
        if unknown or missing:
            raise ChangeListError(f"{where}: unknown field(s) {unknown}, missing field(s) {missing}; "
                                  f"an entry has {', '.join(CHANGE_FIELDS)} (before/after optional).")
        if "before" not in entry and "after" not in entry:
            raise ChangeListError(f"{where}: give before, after or both.")
        for name in ("file", "key", "reason"):
            if not isinstance(entry[name], str):
                raise ChangeListError(f"{where}: {name} must be a string, got {entry[name]!r}.")
        change = {name: entry[name] for name in ("file", "key", "reason")}
        for name in ("before", "after"):
            change[name] = plain(CfgNode._decode_cfg_value(entry[name])) if name in entry else ABSENT
        changes.append(change)
    return changes


def same(a, b):
    """Exact equality of plain values (or ABSENT): 1, 1.0 and True differ; floats compare exactly."""
    if a is ABSENT or b is ABSENT:
        return a is b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def snapshot_value(snapshot, file, key):
    """The stored value of ``key`` for ``file`` (``defaults`` or a snapshot path), or ABSENT."""
    if file == "defaults":
        return snapshot["defaults"].get(key, ABSENT)
    entry = snapshot["files"][file]
    return entry[key] if key in entry else snapshot["defaults"].get(key, ABSENT)


def apply_changes(snapshot, changes):
    """The snapshot after the intended changes, and the problems of the change list.

    Returns:
        (expected, problems): expected = ``{"defaults": flat, "files": {path: flat}}`` with the
        *full* flat config of every file (defaults updated with the file's entry, then the
        changes); problems = messages for entries whose ``before`` no longer matches the
        snapshot, that name an unknown file, repeat another entry or change nothing.
    """
    problems, seen = [], set()
    defaults = dict(snapshot["defaults"])
    file_changes = {}
    for change in changes:
        file, key = change["file"], change["key"]
        label = f"change {file} {key} ({change['reason']})"
        if file != "defaults" and file not in snapshot["files"]:
            problems.append(f"{label}: '{file}' is neither 'defaults' nor a config of the snapshot.")
            continue
        if (file, key) in seen:
            problems.append(f"{label}: listed twice; give one entry per file and key.")
            continue
        seen.add((file, key))
        stored = snapshot_value(snapshot, file, key)
        if not same(stored, change["before"]):
            problems.append(f"{label} is stale: its before is {change['before']!r}, but the snapshot has {stored!r}.")
        if same(change["before"], change["after"]):
            problems.append(f"{label}: before and after are the same ({change['after']!r}), so it changes nothing.")
        if file == "defaults":
            _assign(defaults, key, change["after"])
        else:
            file_changes.setdefault(file, []).append(change)
    files = {}
    for path, entry in snapshot["files"].items():
        full = dict(defaults)
        full.update(entry)
        for change in file_changes.get(path, []):
            _assign(full, change["key"], change["after"])
        files[path] = full
    return {"defaults": defaults, "files": files}, problems


def _assign(flat, key, value):
    if value is ABSENT:
        flat.pop(key, None)
    else:
        flat[key] = value


def differences(expected, actual, listed_keys=()):
    """Messages for every key whose value differs between two flat configs (sorted by key);
    ``listed_keys`` are keys that an intended change covers (said in the message)."""
    messages = []
    for key in sorted(set(expected) | set(actual)):
        want, have = expected.get(key, ABSENT), actual.get(key, ABSENT)
        if same(want, have):
            continue
        if key in listed_keys:
            messages.append(f"{key}: the listed change says after = {want!r}, but the config now gives {have!r}.")
        else:
            messages.append(f"{key}: the snapshot has {want!r}, but the config now gives {have!r} "
                            "(an unlisted change).")
    return messages


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the merged-config snapshot (module docstring).")
    parser.add_argument("--add-new", action="store_true",
                        help="only add the configs missing from the snapshot; keep every stored entry")
    parser.add_argument("--output", type=Path, default=SNAPSHOT, help=f"default: {SNAPSHOT}")
    args = parser.parse_args(argv)
    if args.add_new:
        snapshot = load_snapshot(args.output)
        missing = [path for path in shipped_configs() if path not in snapshot["files"]]
        for path in missing:
            snapshot["files"][path] = file_entry(path)
        print(f"Added {len(missing)} config(s): {', '.join(missing) or '-'}")
    else:
        snapshot = build_snapshot()
        print(f"Wrote {len(snapshot['files'])} configs and {len(snapshot['defaults'])} default keys.")
    os.makedirs(args.output.parent, exist_ok=True)
    args.output.write_text(dumps(snapshot), encoding="utf-8")


if __name__ == "__main__":
    main()
