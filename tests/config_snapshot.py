"""The merged-config snapshot: every shipped config merged over the defaults, as plain data.

A config's *merged config* is what train.py builds from it: the defaults, every trainer's
``TRAINER.<NAME>`` node (``extend_cfg``; all trainers are registered, as in train.py), then
the file (``merge_from_file``). The snapshot (``tests/fixtures/merged_configs.json``) stores
it compactly and exactly:

* ``"defaults"``: the full default config (core keys and every trainer node), one dotted
  key per leaf, e.g. ``"OPTIM.LR": 0.0003``;
* ``"files"``: for every runnable config (``configs/trainers/**/*.yaml`` outside ``_base_``
  folders, and ``configs/datasets/*.yaml``), the merged value of every key the file sets.

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
from vlprompt.config.merge import _load_yaml

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "fixtures" / "merged_configs.json"
BASE_FOLDER = "_base_"  # folders of base configs (``_BASE_`` targets), never run on their own


def shipped_configs(root=ROOT):
    """Repository-relative POSIX paths of the runnable configs, sorted."""
    root = Path(root)
    paths = list(root.glob("configs/trainers/**/*.yaml")) + list(root.glob("configs/datasets/*.yaml"))
    relative = (path.relative_to(root) for path in paths)
    return sorted(path.as_posix() for path in relative if BASE_FOLDER not in path.parts)


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
    """Dotted keys that the config file writes."""
    return set(flatten(_load_yaml(str(Path(root, relative_path)))))


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
