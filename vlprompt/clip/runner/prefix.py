"""Frozen-prefix reuse: blocks before the first one a plan touches are computed once.

* :class:`SharedPrefix` (image tower): the unmodified tower's state at the input of block
  ``start`` [B, N, D] and that block's q, k, v of it (each [B, heads, N, D / heads]), shared
  by several runs from that block within one step (DeAR's prompted branch and its
  regulariser's frozen branch).
* :class:`PrefixCache` (text tower): a bounded LRU of frozen text prefixes
  [N, last + 1, D], keyed by what was computed (block, token ids, ...), so a fixed class
  list pays for the frozen layers once.
* :class:`HostValues`: host-side values derived from tensors (the content digest of
  token ids [N, L], the last pooled position as a Python int), remembered per tensor
  object, so a method that passes the same token-id tensor every step pays the
  device-to-host copy once.
"""
import hashlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch

from .plan import InsertTokens

__all__ = ["SharedPrefix", "PrefixCache", "HostValues", "content_digest"]


@dataclass
class SharedPrefix:
    """The unmodified image tower's state at the input of block ``start``, with that
    block's projections of it, computed once for several runs that start there.

    DeAR's prompted branch (which appends attribute tokens at ``start``) and the frozen
    branch of its regulariser begin with the same N tokens, so block ``start`` normalises
    and projects them once; each run projects only the tokens it adds.

    Attributes:
        hidden: [B, N, D] hidden states at the input of block ``start``.
        start: 0-based index of the first block the runs compute.
        qkv: block ``start``'s (q, k, v) of ``hidden``, each [B, heads, N, D / heads]
            (None when ``start`` is past the last block).
    """

    hidden: torch.Tensor
    start: int
    qkv: Optional[tuple] = None

    def check_plan(self, plan):
        """A run from this prefix may only append tokens at its block (the known q, k, v
        are those of the prefix's N tokens at positions 0..N-1)."""
        num_known = self.hidden.shape[1]
        for edit in plan.edits_at(self.start):
            if not (isinstance(edit, InsertTokens) and (edit.at is None or edit.at >= num_known)):
                raise ValueError(
                    f"A run from a SharedPrefix at block {self.start} may only insert tokens after its "
                    f"{num_known} tokens there (InsertTokens at the end); got {type(edit).__name__}, which "
                    "would change tokens whose projections the prefix holds."
                )


class PrefixCache:
    """A least-recently-used map from a hashable key to a computed prefix, holding at most
    ``size`` entries."""

    def __init__(self, size):
        self.size = size
        self._entries = OrderedDict()

    def __len__(self):
        return len(self._entries)

    def get(self, key, compute):
        """The entry of ``key``, computed by ``compute()`` (and stored) on a miss."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = compute()
        self._entries[key] = value
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value

    def clear(self):
        self._entries.clear()


def content_digest(tensor):
    """A digest of the values of ``tensor`` (copies them to the host)."""
    return hashlib.blake2b(tensor.detach().cpu().numpy().tobytes(), digest_size=16).digest()


class HostValues:
    """Host-side values computed from tensors, remembered per tensor object and its
    version counter: asking again about the same, unchanged tensor reads nothing back
    from the device.

    A different tensor object (even with equal content) or the same one changed in place
    (which bumps its version counter) is computed again. Holds only weak references to the
    tensors (a tensor's values are forgotten when it is freed), and the values of at most
    ``size`` of them (least recently used dropped).
    Not seen: writes that bypass the version counter (through ``tensor.data``); inference
    tensors have no version counter and are never remembered.
    """

    def __init__(self, size):
        self.size = size
        self._entries = OrderedDict()  # id(tensor) -> (weak reference, version, {name: value})

    def __len__(self):
        return len(self._entries)

    def get(self, tensor, name, compute):
        """``compute(tensor)``, remembered under ``name`` for this tensor object.

        Inside torch.compile a value known for this tensor object is a constant of the traced
        graph (dynamo guards on the tensor's identity and on this map); an unknown one is
        computed and remembered outside the graph, which breaks it (the next call, with the
        value known, is traced again as one graph). A traced lookup does not read the version
        counter (dynamo cannot): a compiled step must not change such a tensor in place, as no
        method here does.
        """
        if torch.compiler.is_compiling():  # looked up by identity: dynamo cannot take id() of every tensor
            for reference, _, values in self._entries.values():
                if reference() is tensor and name in values:
                    return values[name]
            return self._remember_untraced(tensor, name, compute)
        return self._remember(tensor, name, compute)

    def _remember(self, tensor, name, compute):
        if tensor.is_inference():
            return compute(tensor)
        key = id(tensor)
        entry = self._entries.get(key)
        if entry is None or entry[0]() is not tensor or entry[1] != tensor._version:
            entry = (weakref.ref(tensor, lambda _, entries=self._entries: entries.pop(key, None)), tensor._version, {})
            self._entries[key] = entry
        self._entries.move_to_end(key)
        values = entry[2]
        if name not in values:
            values[name] = compute(tensor)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return values[name]

    @torch.compiler.disable
    def _remember_untraced(self, tensor, name, compute):
        return self._remember(tensor, name, compute)

    def clear(self):
        self._entries.clear()
