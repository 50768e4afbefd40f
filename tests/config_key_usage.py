"""Which config keys the code reads: a static scan of the Python sources (used by
tests/test_config_keys_used.py).

A key ``A.B.C`` counts as read where a scanned source file loads it, found with :mod:`ast`:

* an attribute chain ending in upper-case names, ``cfg.A.B.C`` or ``loader.B.C``; assignments
  to a key (``cfg.A.B.C = 1``, how trainers define their nodes) are not reads;
* a lookup by name: ``node["C"]``, ``node.get("C", ...)``, ``getattr(node, "C")``;
* through an alias of a config node: ``node = cfg.A.B`` (also ``self.node = ...``, tuple
  unpacking, either branch of ``x if c else y``), or a function parameter that some call
  passes ``cfg.A.B`` to, followed by ``node.C``. A lookup with a computed name,
  ``cfg.TRAINER[name]`` or ``cfg.TRAINER.get(name)``, stands for every node under ``TRAINER``.

The upper-case names at the end of a resolved chain must be the last names of the key, and
at least two of them (``B.C``), so that ``optim.NAME`` with an unknown ``optim`` does not count
as a read of every ``*.NAME`` key; one name is enough for a top-level key and for a name that
only one key ends with. Aliases are collected per file, not per function (a deliberate
over-approximation: the scan must not report keys that are read, and a name reused for two
nodes in one file is rare).
"""
import ast
import re
from pathlib import Path

from yacs.config import CfgNode

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("vlprompt", "trainers", "datasets", "tools", "train.py")
# The definitions of the defaults, not reads of them.
EXCLUDED = ("vlprompt/config/defaults.py",)
ANY = "*"  # a computed node name, e.g. cfg.TRAINER[name]

_UPPER = re.compile(r"^[A-Z][A-Z0-9_]*$")
_PASSES = 4  # alias propagation rounds (alias of an alias passed to a function ...)


def config_keys(node, prefix=()):
    """Every leaf key of a CfgNode as a tuple of names, e.g. ("OPTIM", "LR")."""
    keys = []
    for name, value in node.items():
        if isinstance(value, CfgNode):
            keys.extend(config_keys(value, prefix + (name,)))
        else:
            keys.append(prefix + (name,))
    return keys


def source_files(root=ROOT):
    files = []
    for entry in SCANNED:
        path = root / entry
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return [path for path in files if path.relative_to(root).as_posix() not in EXCLUDED]


def _is_name(value):
    return isinstance(value, ast.Constant) and isinstance(value.value, str)


def _chain(node):
    """Names of an attribute / subscript / lookup chain, base first, or None.

    ``self.cfg.OPTIM.LR`` -> ["self", "cfg", "OPTIM", "LR"]; ``node["LR"]`` and
    ``node.get("LR")`` -> ["node", "LR"]; ``cfg.TRAINER[name]`` -> ["cfg", "TRAINER", "*"].
    """
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            names.append(node.slice.value if _is_name(node.slice) else ANY)
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            names.append(node.args[0].value if _is_name(node.args[0]) else ANY)
            node = node.func.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2:
            names.append(node.args[1].value if _is_name(node.args[1]) else ANY)
            node = node.args[0]
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names[::-1]
        else:
            return None


def _split(names):
    """(lower-case base, upper-case tail) of a chain; the tail starts with an upper-case name
    (a computed name, ``*``, only stands for a node below a named one)."""
    cut = len(names)
    while cut > 0 and (names[cut - 1] == ANY or _UPPER.match(names[cut - 1])):
        cut -= 1
    while cut < len(names) and names[cut] == ANY:
        cut += 1
    return names[:cut], tuple(names[cut:])


def _resolve(expr, aliases):
    """The upper-case tails (tuples) that ``expr`` may stand for, through ``aliases``."""
    if isinstance(expr, ast.IfExp):
        return _resolve(expr.body, aliases) | _resolve(expr.orelse, aliases)
    names = _chain(expr)
    if names is None:
        return set()
    base, tail = _split(names)
    found = {tail} if tail else set()
    if ANY not in base:
        found.update(prefix + tail for prefix in aliases.get(".".join(base), ()))
    return found


class _Index:
    """What the scan needs of one parsed file, collected in a single walk of its tree:

    * assignments: (target expression, value expression) of every plain, annotated and
      unpacking assignment;
    * params: {function or class name: [parameter names without self/cls]} of its defs;
    * calls: (called name, call node) of every call by simple or attribute name;
    * loads: the attribute and subscript loads and the calls (where a key may be read).
    """

    def __init__(self, tree):
        self.assignments, self.params, self.calls, self.loads = [], {}, [], []
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        self.assignments.extend(zip(target.elts, node.value.elts))
                    else:
                        self.assignments.append((target, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                self.assignments.append((node.target, node.value))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        self.params[node.name] = [arg.arg for arg in item.args.args[1:]]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [arg.arg for arg in node.args.args + node.args.kwonlyargs]
                self.params[node.name] = names[1:] if names[:1] in (["self"], ["cls"]) else names
            if isinstance(node, ast.Call):
                self.loads.append(node)
                if isinstance(node.func, ast.Name):
                    self.calls.append((node.func.id, node))
                elif isinstance(node.func, ast.Attribute):
                    self.calls.append((node.func.attr, node))
            elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Load):
                self.loads.append(node)


def scan(root=ROOT):
    """Every upper-case tail that the scanned sources load (module docstring)."""
    files = [_Index(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))) for path in source_files(root)]
    aliases = [dict() for _ in files]
    for _ in range(_PASSES):
        passed = {}  # function name -> {parameter: tails}
        for found, file_aliases in zip(files, aliases):
            for target, value in found.assignments:
                names = _chain(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
                if names and not _split(names)[1]:
                    file_aliases.setdefault(".".join(names), set()).update(_resolve(value, file_aliases))
            for name, call in found.calls:
                arguments = [(index, arg) for index, arg in enumerate(call.args)]
                arguments += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg]
                for position, arg in arguments:
                    tails = _resolve(arg, file_aliases)
                    if tails:
                        passed.setdefault(name, {}).setdefault(position, set()).update(tails)
        for found, file_aliases in zip(files, aliases):
            for function in found.params.keys() & passed.keys():  # the functions this file defines
                for position, tails in passed[function].items():
                    names = found.params[function]
                    param = names[position] if isinstance(position, int) and position < len(names) else position
                    if param in names:
                        file_aliases.setdefault(param, set()).update(tails)
    reads = set()
    for found, file_aliases in zip(files, aliases):
        for node in found.loads:
            reads.update(_resolve(node, file_aliases))
    return reads


def _matches(tail, key):
    return len(tail) <= len(key) and all(t in (ANY, k) for t, k in zip(tail, key[len(key) - len(tail):]))


def unread_keys(cfg, root=ROOT):
    """The leaf keys of ``cfg`` that no scanned source reads, as dotted strings."""
    keys = config_keys(cfg)
    leaf_counts = {}
    for key in keys:
        leaf_counts[key[-1]] = leaf_counts.get(key[-1], 0) + 1
    by_last = {}  # a tail can match only keys ending with its last name (or any, for "*")
    for tail in scan(root):
        by_last.setdefault(tail[-1] if tail else None, []).append(tail)

    def is_read(key):
        candidates = by_last.get(key[-1], []) + by_last.get(ANY, []) + by_last.get(None, [])
        return any(
            _matches(tail, key) and (len(tail) >= 2 or len(key) == 1 or leaf_counts[key[-1]] == 1)
            for tail in candidates
        )

    return [".".join(key) for key in keys if not is_read(key)]
