"""Which head-role map belongs to which CLIP: a registry keyed by (backbone, weights).

A role map (format in :mod:`vlprompt.clip.head_roles`) is intrinsic to one image tower with
one set of weights, so it is registered under the pair that ``MODEL.BACKBONE.NAME`` and
``MODEL.BACKBONE.WEIGHTS`` name, like open_clip's registry of pretrained weights::

    name               backbone, weights                                          file
    vit_b16_openai     ViT-B/16, openai                                           configs/head_roles/vit_b16_openai.yaml
    tiny_synthetic     configs/clip/tiny-synthetic-clip.json, weights/tiny-...pt  configs/head_roles/tiny_synthetic.yaml
    tiny_synthetic_eva02_discovered  configs/clip/tiny-synthetic-eva02.json, weights/tiny-...-eva02.pt
                                     configs/head_roles/tiny_synthetic_eva02_discovered.yaml

``find_role_map(spec, backbone, weights)`` reads ``TRAINER.DEAR.ROLE_MAP``:

* ``auto``: the default map registered for (backbone, weights); a pair without one is an
  error that lists the known maps and names ``tools/head_roles.py``, which makes a map;
* a registered name (``vit_b16_openai``, ``tiny_synthetic_discovered``, ...): that map;
* otherwise a file path: absolute, or relative to the current directory, else to the
  repository root (so the paths in the shipped configs work from any directory).

Keys are compared after normalisation (:func:`backbone_key`): the OpenAI names and their
open_clip spellings are one backbone (``ViT-B/16`` = ``ViT-B-16`` = ``ViT-B-16-quickgelu``),
empty weights of an OpenAI name are ``openai``, and a model-config or weights file is named
by its path relative to the repository (or its absolute path outside it), whichever
directory it was given from. Registered files are relative to the repository, never to the
current directory.
"""
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .head_roles import RoleMap, RoleMapError, load_role_map
from .loading import OPENAI_MODELS

__all__ = [
    "AUTO", "REPOSITORY", "MissingRoleMapError", "RegisteredRoleMap", "backbone_key", "find_role_map",
    "register_role_map", "registered_role_maps", "resolve_role_map",
]

AUTO = "auto"
# The repository root (this file is vlprompt/clip/role_map_registry.py).
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WEIGHT_FILE_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
# open_clip spelling of an OpenAI name (ViT-B-16, also with -quickgelu) -> the OpenAI name
_OPENAI_ALIASES = {open_clip_name.lower(): name for name, (open_clip_name, _) in OPENAI_MODELS.items()}


@dataclass(frozen=True)
class RegisteredRoleMap:
    """One registry entry.

    Attributes:
        name: what ``TRAINER.DEAR.ROLE_MAP`` may say to select it.
        backbone, weights: the normalised key (see :func:`backbone_key`).
        path: the role-map file, relative to the repository root.
        default: whether ``auto`` selects it for its key (one default per key).
    """

    name: str
    backbone: str
    weights: str
    path: str
    default: bool

    @property
    def file(self):
        """Absolute path of the role-map file."""
        return os.path.join(REPOSITORY, self.path)

    def describe(self):
        """One line for listings: "backbone, weights -> file (name[, by name only])"."""
        use = self.name if self.default else f"{self.name}; by name only, not auto"
        return f"{self.backbone}, {self.weights} -> {self.path} ({use})"


_REGISTRY: Dict[str, RegisteredRoleMap] = {}


def _existing_file(path):
    """``path`` if absolute, else the first of cwd/path and repository/path that exists (or None)."""
    path = os.path.expanduser(path)
    candidates = [path] if os.path.isabs(path) else [os.path.abspath(path), os.path.join(REPOSITORY, path)]
    return next((candidate for candidate in candidates if os.path.isfile(candidate)), None)


def _canonical_path(path):
    """A file path as the registry keys it: relative to the repository when inside it (with
    "/" separators), else absolute; the file is looked up as in :func:`_existing_file`."""
    real = os.path.realpath(_existing_file(path) or os.path.expanduser(path))
    relative = os.path.relpath(real, REPOSITORY)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return real
    return relative.replace(os.sep, "/")


def backbone_key(backbone, weights) -> Tuple[str, str]:
    """The normalised (backbone, weights) pair of ``MODEL.BACKBONE.NAME`` and ``.WEIGHTS``.

    ``ViT-B/16``, ``ViT-B-16`` and ``ViT-B-16-quickgelu`` all give ``ViT-B/16``; empty weights
    of an OpenAI name give ``openai``; a ``.json`` model config and a weights file (a path
    with a separator or a weights suffix) give their canonical path (see module docstring).
    """
    backbone, weights = str(backbone or "").strip(), str(weights or "").strip()
    if backbone.endswith(".json"):
        backbone = _canonical_path(backbone)
    else:
        spelling = backbone.replace("/", "-").lower()
        spelling = spelling[: -len("-quickgelu")] if spelling.endswith("-quickgelu") else spelling
        backbone = _OPENAI_ALIASES.get(spelling, backbone)
    if not weights and backbone in OPENAI_MODELS:
        weights = "openai"
    elif "/" in weights or os.sep in weights or weights.endswith(_WEIGHT_FILE_SUFFIXES):
        weights = _canonical_path(weights)
    return backbone, weights


def register_role_map(name, backbone, weights, path, default=True):
    """Register the role-map file ``path`` (relative to the repository) as ``name`` for the
    CLIP that ``backbone`` and ``weights`` name; ``default``: ``auto`` selects it for that CLIP.

    Raises:
        ValueError: ``name`` is taken, looks like a path, or the key already has a default.
    """
    if not name or "/" in name or name.endswith((".yaml", ".yml")) or name == AUTO:
        raise ValueError(f'Role-map name "{name}" must be a plain name (no "/", no .yaml, not "{AUTO}").')
    if name in _REGISTRY:
        raise ValueError(f'A role map named "{name}" is already registered ({_REGISTRY[name].describe()}).')
    backbone, weights = backbone_key(backbone, weights)
    if default:
        for entry in _REGISTRY.values():
            if entry.default and (entry.backbone, entry.weights) == (backbone, weights):
                raise ValueError(
                    f'"{entry.name}" is already the default role map of {backbone}, {weights}; '
                    f'register "{name}" with default=False.'
                )
    _REGISTRY[name] = RegisteredRoleMap(name, backbone, weights, path, default)


def registered_role_maps() -> List[RegisteredRoleMap]:
    """All registry entries, in registration order."""
    return list(_REGISTRY.values())


class MissingRoleMapError(RoleMapError):
    """``auto`` found no role map registered for the backbone (a method may add how to make one)."""


def _known_maps():
    lines = [f"  {entry.describe()}" for entry in _REGISTRY.values()]
    return "Known role maps (backbone, weights -> file (name)):\n" + "\n".join(lines)


def resolve_role_map(spec, backbone="", weights="") -> Tuple[str, str]:
    """Find the file that ``TRAINER.DEAR.ROLE_MAP`` = ``spec`` means for this backbone.

    Returns:
        (file, label): the absolute path to read and how to name it in messages.

    Raises:
        RoleMapError: ``auto`` for a backbone without a registered default, or a name that is
            neither registered nor an existing file; both messages list the known maps.
    """
    spec = str(spec or "").strip()
    if not spec:
        raise RoleMapError(
            f'TRAINER.DEAR.ROLE_MAP is empty: set it to "{AUTO}" (the map registered for MODEL.BACKBONE), '
            f"a registered map name or a role-map YAML file.\n{_known_maps()}"
        )
    if spec == AUTO:
        if not str(backbone or "").strip():
            raise RoleMapError(
                f"TRAINER.DEAR.ROLE_MAP is {AUTO}, which looks the role map up by MODEL.BACKBONE.NAME and "
                f"WEIGHTS, but no backbone was named. Name one, or set ROLE_MAP to a map name or file.\n"
                f"{_known_maps()}"
            )
        key = backbone_key(backbone, weights)
        for entry in _REGISTRY.values():
            if entry.default and (entry.backbone, entry.weights) == key:
                return entry.file, entry.path
        raise MissingRoleMapError(
            f'No head-role map is registered for backbone "{key[0]}" with weights "{key[1]}" '
            f"(MODEL.BACKBONE.NAME, MODEL.BACKBONE.WEIGHTS), and TRAINER.DEAR.ROLE_MAP is {AUTO}.\n"
            f"{_known_maps()}\n"
            "Make a map for this backbone with tools/head_roles.py (docs/head_roles.md) and set "
            "TRAINER.DEAR.ROLE_MAP to its file, or use TRAINER.DEAR.MASK_STRATEGY all_mixed or "
            "all_generalization, which need no map."
        )
    if spec in _REGISTRY:
        return _REGISTRY[spec].file, _REGISTRY[spec].path
    found = _existing_file(spec)
    if found is None:
        raise RoleMapError(
            f'Role map "{spec}" does not exist (relative paths are read from the current directory, then '
            f"from the repository root {REPOSITORY}) and is not a registered map name.\n{_known_maps()}"
        )
    return found, spec


def find_role_map(spec, backbone="", weights="") -> RoleMap:
    """Load and validate the role map that ``spec`` (``TRAINER.DEAR.ROLE_MAP``) selects for
    the CLIP named by ``backbone`` and ``weights`` (``MODEL.BACKBONE.NAME``, ``.WEIGHTS``)."""
    file, label = resolve_role_map(spec, backbone, weights)
    return load_role_map(file, label=label)


register_role_map("vit_b16_openai", "ViT-B/16", "openai", "configs/head_roles/vit_b16_openai.yaml")
register_role_map("tiny_synthetic", "configs/clip/tiny-synthetic-clip.json", "weights/tiny-synthetic-clip.pt",
                  "configs/head_roles/tiny_synthetic.yaml")
register_role_map("tiny_synthetic_discovered", "configs/clip/tiny-synthetic-clip.json",
                  "weights/tiny-synthetic-clip.pt", "configs/head_roles/tiny_synthetic_discovered.yaml", default=False)
register_role_map("tiny_synthetic_eva02_discovered", "configs/clip/tiny-synthetic-eva02.json",
                  "weights/tiny-synthetic-eva02.pt", "configs/head_roles/tiny_synthetic_eva02_discovered.yaml")
