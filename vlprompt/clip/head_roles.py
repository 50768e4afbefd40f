"""Head-role maps: which attention heads of a CLIP image tower do what, and the masks they imply.

A role map is a YAML file, one per backbone and weights (DeAR paper, supp. Table 2 for
ViT-B/16 OpenAI), found by backbone and weights through the registry in
:mod:`vlprompt.clip.role_map_registry` (``TRAINER.DEAR.ROLE_MAP auto``)::

    backbone: ViT-B/16          # informative
    weights: openai             # informative
    num_layers: 12              # depth of the image tower (checked against the model)
    num_heads: 12               # heads per layer (checked against the model)
    attributes: [color, shape, texture, object, location]
    roles:                      # 1-indexed layer -> one role per head (list index = head)
      9:  [A location, A location, M, A location, O emotion, G style, M, ...]
      ...

Role strings: ``A <attribute>`` (core attribute head; the attribute is one of
``attributes``), ``O <concept>`` (other specialised head), ``G`` or ``G <concept>``
(generalization head), ``M`` (mixed head). The listed layers are the deep layers: a
contiguous range ending at the last layer, every one with exactly ``num_heads`` roles.
An optional ``notes`` string is kept as free text.

Layers are 1-indexed as in the paper; heads are 0-indexed.

What a role means for attention (DeAR, Eq. 8 and 9), given the attributes a model uses:

* a specialised head (``A`` or ``O``) whose concept is one of those attributes is the
  core head of that attribute: every query sees the original tokens and that
  attribute's tokens, never another attribute's tokens;
* ``G`` heads, and specialised heads of any other concept (e.g. ``O animal``, or
  ``A color`` when colour is not used), are isolated: original tokens and attribute
  tokens do not see each other (attribute tokens still see attribute tokens);
* ``M`` heads are not masked.
"""
import os
import random
from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Sequence, Tuple

import torch
import yaml

from vlprompt.config import ConfigError
from vlprompt.paths import repository_root
from vlprompt.utils import write_text

__all__ = [
    "HeadRole", "RoleMap", "RoleMapError", "ROLE_KINDS", "load_role_map", "model_file_label", "parse_role_map",
    "role_attention_mask",
]

ROLE_KINDS = {"A": "core attribute", "O": "other specialised", "G": "generalization", "M": "mixed"}
_ROLE_FORMS = '"A <attribute>", "O <concept>", "G", "G <concept>" or "M"'
_REQUIRED_KEYS = ("num_layers", "num_heads", "attributes", "roles")
_INFORMATIVE_KEYS = ("backbone", "weights", "notes")


class RoleMapError(ConfigError):
    """A role-map file that cannot be used (the message names the bad entry)."""


@dataclass(frozen=True)
class HeadRole:
    """The role of one attention head.

    Attributes:
        kind: "A", "O", "G" or "M" (see ROLE_KINDS).
        concept: the attribute (A), the concept (O, optional for G), "" for M.
    """

    kind: str
    concept: str = ""

    @classmethod
    def parse(cls, text, where="role"):
        """Parse "A color", "O text", "G", "G style" or "M"; ``where`` names the entry in errors."""
        if not isinstance(text, str) or not text.split():
            raise RoleMapError(f"{where}: expected a role string ({_ROLE_FORMS}), got {text!r}.")
        kind, _, concept = text.strip().partition(" ")
        concept = " ".join(concept.split())
        if kind not in ROLE_KINDS:
            raise RoleMapError(f'{where}: role "{text}" does not start with A, O, G or M (expected {_ROLE_FORMS}).')
        if kind in ("A", "O") and not concept:
            raise RoleMapError(f'{where}: role "{text}" needs a concept, e.g. "{kind} color".')
        if kind == "M" and concept:
            raise RoleMapError(f'{where}: role "{text}": a mixed head has no concept, write "M".')
        return cls(kind, concept)

    def __str__(self):
        return f"{self.kind} {self.concept}" if self.concept else self.kind

    def core_attribute(self, attributes):
        """The attribute this head is the core head of, given the attributes in use, else None."""
        if self.kind in ("A", "O") and self.concept in attributes:
            return self.concept
        return None

    def isolated(self, attributes):
        """True if original and attribute tokens must not see each other in this head."""
        return self.kind != "M" and self.core_attribute(attributes) is None


@dataclass
class RoleMap:
    """A validated role map (see the module docstring).

    Attributes:
        num_layers, num_heads: the image tower the map was made for.
        attributes: core attributes the ``A`` roles may name.
        roles: 1-indexed layer -> tuple of num_heads HeadRole (head index = position).
        backbone, weights, notes: informative.
        source: where the map came from (used in error messages).
    """

    num_layers: int
    num_heads: int
    attributes: Tuple[str, ...]
    roles: Dict[int, Tuple[HeadRole, ...]]
    backbone: str = ""
    weights: str = ""
    notes: str = ""
    source: str = "role map"
    concepts: Tuple[str, ...] = field(init=False)

    def __post_init__(self):
        found = [role.concept for layer in self.roles.values() for role in layer if role.kind in ("A", "O")]
        self.concepts = tuple(dict.fromkeys(list(self.attributes) + found))

    @property
    def first_layer(self):
        """First deep layer (1-indexed)."""
        return min(self.roles)

    def check_backbone(self, num_layers, num_heads):
        """Raise RoleMapError unless the map was made for a tower of this shape."""
        if (num_layers, num_heads) != (self.num_layers, self.num_heads):
            raise RoleMapError(
                f"{self.source} describes an image tower with {self.num_layers} layers of "
                f"{self.num_heads} heads (num_layers, num_heads), but the loaded backbone has "
                f"{num_layers} layers of {num_heads} heads. Use the role map made for this backbone "
                "(TRAINER.DEAR.ROLE_MAP)."
            )

    def check_inject_layer(self, layer):
        """Raise RoleMapError unless the map gives roles for every layer ``layer``..num_layers.

        [decision] Layers the map lists below ``layer`` are allowed and unused, so the map of
        layers 9..12 serves INJECT_LAYER 9, 10, 11 or 12.
        """
        if not 1 <= layer <= self.num_layers:
            raise RoleMapError(
                f"The injection layer {layer} is outside the {self.num_layers} layers (1-indexed) "
                f"of the backbone of {self.source}."
            )
        if layer < self.first_layer:
            raise RoleMapError(
                f"The injection layer is {layer}, but {self.source} gives head roles only for layers "
                f"{self.first_layer}..{self.num_layers}: layer {layer} has no roles. Inject at layer "
                f"{self.first_layer} or later, or use a role map that covers layer {layer}."
            )

    def check_attributes(self, attributes):
        """Raise RoleMapError if an attribute is neither an attribute nor a concept of the map."""
        for name in attributes:
            if name not in self.concepts:
                raise RoleMapError(
                    f'Attribute "{name}" (TRAINER.DEAR.ATTRIBUTES) is not known to {self.source}: '
                    f"its attributes and specialised concepts are {', '.join(self.concepts)}."
                )

    def deep_roles(self, first_layer):
        """Roles of layers ``first_layer``..num_layers: {layer: tuple of HeadRole}."""
        return {layer: roles for layer, roles in self.roles.items() if layer >= first_layer}

    def shuffled(self, seed, first_layer):
        """A copy whose roles of layers ``first_layer``..num_layers are permuted over all their
        heads with ``random.Random(seed)`` (DeAR's random role shuffle ablation)."""
        layers = sorted(self.deep_roles(first_layer))
        pool = [role for layer in layers for role in self.roles[layer]]
        random.Random(seed).shuffle(pool)
        roles = dict(self.roles)
        for index, layer in enumerate(layers):
            roles[layer] = tuple(pool[index * self.num_heads : (index + 1) * self.num_heads])
        return replace(self, roles=roles, source=f"{self.source} (roles shuffled with seed {seed})")

    def to_yaml(self):
        """The map in the file format (roles one flow list per layer)."""
        lines = []
        for key in ("backbone", "weights"):
            if getattr(self, key):
                lines.append(f"{key}: {getattr(self, key)}")
        lines += [
            f"num_layers: {self.num_layers}",
            f"num_heads: {self.num_heads}",
            f"attributes: [{', '.join(self.attributes)}]",
        ]
        if self.notes:
            lines.append("notes: " + yaml.safe_dump(self.notes, default_style='"', width=10**6).strip())
        lines.append("roles:")
        width = len(str(self.num_layers)) + 1
        for layer in sorted(self.roles):
            lines.append(f"  {f'{layer}:':<{width}} [{', '.join(str(role) for role in self.roles[layer])}]")
        return "\n".join(lines) + "\n"

    def save(self, path):
        """Write ``to_yaml()`` to ``path`` atomically (an interrupted save keeps the previous file)."""
        write_text(self.to_yaml(), path)


def model_file_label(value):
    """How a role map names its backbone or weights (informative fields): a file inside the
    repository by its path relative to the repository (as the configs name it, from any
    working directory), another existing file by its file name (no user's folders in a map
    meant to be shared), anything else (a tag such as ``openai``, a hub name) as given."""
    value = str(value)
    if not os.path.isfile(value):
        return value
    path, root = os.path.abspath(value), str(repository_root())
    if path.startswith(root + os.sep):
        return os.path.relpath(path, root).replace(os.sep, "/")
    return os.path.basename(path)


def load_role_map(path, label=None):
    """Read and validate a role-map YAML file (to find one by backbone or name, see
    :func:`vlprompt.clip.role_map_registry.find_role_map`).

    Args:
        path: the file (relative paths are read from the current directory).
        label: how messages name the file (default: ``path``).

    Raises:
        RoleMapError: missing or unreadable file, or an invalid entry (named in the message).
    """
    if not path:
        raise RoleMapError("No role map given: set TRAINER.DEAR.ROLE_MAP to a role-map YAML file.")
    label = label or path
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise RoleMapError(
            f'Role map "{label}" does not exist (relative paths are read from the current directory).'
        ) from None
    except yaml.YAMLError as error:
        raise RoleMapError(f'Role map "{label}" is not valid YAML: {" ".join(str(error).split())}') from None
    return parse_role_map(data, source=f'role map "{label}"')


def _positive_int(data, key, source):
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RoleMapError(f"{source}: {key} must be a positive whole number, got {value!r}.")
    return value


def parse_role_map(data, source="role map"):
    """Validate the mapping read from a role-map file and return a RoleMap."""
    if not isinstance(data, dict):
        raise RoleMapError(f"{source} must hold a mapping with keys {', '.join(_REQUIRED_KEYS)}.")
    for key in data:
        if key not in _REQUIRED_KEYS + _INFORMATIVE_KEYS:
            raise RoleMapError(
                f'{source}: unknown key "{key}" (expected {", ".join(_REQUIRED_KEYS + _INFORMATIVE_KEYS)}).'
            )
    missing = [key for key in _REQUIRED_KEYS if key not in data]
    if missing:
        raise RoleMapError(f"{source}: missing key(s) {', '.join(missing)}.")
    num_layers = _positive_int(data, "num_layers", source)
    num_heads = _positive_int(data, "num_heads", source)
    attributes = data["attributes"]
    if not isinstance(attributes, list) or not all(isinstance(a, str) and a.strip() for a in attributes):
        raise RoleMapError(f"{source}: attributes must be a list of names, got {attributes!r}.")
    attributes = tuple(" ".join(a.split()) for a in attributes)
    if len(set(attributes)) != len(attributes):
        raise RoleMapError(f"{source}: attributes list a name twice: {list(attributes)}.")
    if not isinstance(data["roles"], dict) or not data["roles"]:
        raise RoleMapError(f"{source}: roles must map layer numbers (1-indexed) to lists of {num_heads} roles.")

    roles = {}
    for key, entries in data["roles"].items():
        layer = _layer_number(key, num_layers, source)
        if layer in roles:
            raise RoleMapError(f"{source}: layer {layer} is listed twice.")
        where = f"{source}, layer {layer}"
        if not isinstance(entries, list):
            raise RoleMapError(f"{where}: expected a list of {num_heads} roles (one per head), got {entries!r}.")
        if len(entries) != num_heads:
            problem = "is missing head(s)" if len(entries) < num_heads else "has too many heads"
            raise RoleMapError(
                f"{where} {problem}: it lists {len(entries)} roles, but num_heads is {num_heads} "
                f"(one role per head 0..{num_heads - 1})."
            )
        layer_roles = []
        for head, text in enumerate(entries):
            role = HeadRole.parse(text, where=f"{where}, head {head}")
            if role.kind == "A" and role.concept not in attributes:
                raise RoleMapError(
                    f'{where}, head {head}: unknown attribute "{role.concept}" in role "{text}" '
                    f"(attributes: {', '.join(attributes)}). Add it to attributes or use \"O {role.concept}\"."
                )
            layer_roles.append(role)
        roles[layer] = tuple(layer_roles)

    first = min(roles)
    for layer in range(first, num_layers + 1):
        if layer not in roles:
            raise RoleMapError(
                f"{source}: layer {layer} is missing; the deep layers {first}..{num_layers} must all be listed."
            )
    return RoleMap(
        num_layers=num_layers, num_heads=num_heads, attributes=attributes, roles=roles,
        backbone=str(data.get("backbone") or ""), weights=str(data.get("weights") or ""),
        notes=str(data.get("notes") or ""), source=source,
    )


def _layer_number(key, num_layers, source):
    try:
        layer = int(key)
    except (TypeError, ValueError):
        raise RoleMapError(f"{source}: roles key {key!r} is not a layer number (1-indexed).") from None
    if isinstance(key, bool) or not 1 <= layer <= num_layers:
        raise RoleMapError(f"{source}: layer {key} is out of range: layers are 1..{num_layers} (num_layers).")
    return layer


def role_attention_mask(roles: Sequence[HeadRole], attributes: Sequence[str], num_original: int,
                        tokens_per_attribute: int, device=None) -> Optional[torch.Tensor]:
    """The role-based additive attention mask of one layer (DeAR Eq. 8 and 9).

    The sequence is [original tokens (num_original), then the attribute tokens grouped by
    attribute in the order of ``attributes``, tokens_per_attribute each].

    Args:
        roles: one HeadRole per head.
        attributes: the attributes whose tokens are in the sequence.

    Returns:
        [heads, L, L] float32 mask (0 = allowed, -inf = blocked), or None when no head is
        masked (all mixed, or no attribute tokens).
    """
    num_attr = len(attributes) * tokens_per_attribute
    if num_attr == 0 or all(role.kind == "M" for role in roles):
        return None
    length = num_original + num_attr
    mask = torch.zeros(len(roles), length, length, device=device)
    blocked = float("-inf")
    original, attribute = slice(0, num_original), slice(num_original, length)
    for head, role in enumerate(roles):
        core = role.core_attribute(attributes)
        if core is not None:
            own = num_original + list(attributes).index(core) * tokens_per_attribute
            mask[head, :, attribute] = blocked
            mask[head, :, own : own + tokens_per_attribute] = 0.0
        elif role.isolated(attributes):
            mask[head, original, attribute] = blocked
            mask[head, attribute, original] = blocked
    return mask
