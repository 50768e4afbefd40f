"""Tower runs a comparison's model repeats on equal inputs, computed once (our side of the fidelity tests).

A comparison runs our model once with the recorded values and once per misplacement, and a method's
``run_ours`` often encodes the same images several times (its logits, its loss, its fused logits):
the frozen prefix of the image tower, the plain (unprompted) encodings, and prompted encodings whose
prompts a misplacement does not touch (a text-side misplacement leaves the image plan as it was)
are the same computation again. ``keep_tower_runs(runner)`` makes the runner's two towers keep the
results of such runs and give them back when a later run is provably the same:

* the same tower object (a rebuilt model has new towers, which start empty), whose parameters and
  buffers are the same tensor objects at the same versions (an in-place write, such as the harness
  writing a learnable value, bumps the version) and whose modules' plain attributes (``training``,
  flags, sizes) are equal;
* inputs equal in dtype, shape, device and value (images, token ids, text embeddings, pooled
  positions, hidden states a run continues from; compared element by element, not by a digest),
  the same start block and rows, the same autocast state;
* a plan made only of masks and edits whose result depends on their fields alone (``InsertTokens``,
  ``ReplaceTokens``, MMRL++'s ``BlendTokens``), equal field by field (tokens and masks compared
  element by element); a plan with any other edit (``MapTokens``, whose function may record what it
  sees), a parallel branch, or anything else is always run;
* no hook on any of the tower's modules (nor a global module hook), which could record what a run sees;
* and a result without a gradient: a run that would need one (grad mode on and any input, plan
  tensor or tower parameter requiring grad) is always run and never kept.

Each tower keeps its last ``KEPT_RUNS`` results; a copy of a tower (``copy.deepcopy``) starts
empty. What is given back is a copy of the kept result, so a caller that changes it in place
changes nothing kept. Nothing here changes what a tower computes: a kept result is the one that
tower computed for equal inputs.
"""
import functools

import torch

from vlprompt.clip.runner.plan import EMPTY_PLAN, InsertTokens, Plan, ReplaceTokens
from vlprompt.utils import map_tensors, nested_tensors

__all__ = ["keep_tower_runs", "kept_run_counts", "KEPT_RUNS"]

KEPT_RUNS = 16
_PLAIN = (bool, int, float, str, type(None))


class _Uncacheable(Exception):
    """A run whose inputs cannot be compared (it is always run)."""


class KeptRuns:
    """The results a tower keeps: [(key, tower state, result)], the most recent last."""

    def __init__(self, size=KEPT_RUNS):
        self.size, self.entries = size, []
        self.hits = self.misses = 0

    def __deepcopy__(self, memo):
        return KeptRuns(self.size)

    def run(self, tower, key, compute):
        """``compute()``, or a copy of the result kept for an equal ``key`` and the same tower state."""
        state = _tower_state(tower)
        for index, (kept_key, kept_state, result) in enumerate(self.entries):
            if _same_state(kept_state, state) and _equal(kept_key, key):
                self.entries.append(self.entries.pop(index))
                self.hits += 1
                return _copied(result)
        self.misses += 1
        result = compute()
        if not _needs_grad(result):
            self.entries.append((_copied(key), state, _copied(result)))
            del self.entries[:-self.size]
        return result


def _tower_state(tower):
    """(tensors, their versions, the modules' plain attributes) of ``tower``: its parameters and
    buffers (the objects themselves), and every attribute of a plain type of each submodule."""
    tensors = [*tower.parameters(), *tower.buffers()]
    attributes = []
    for module in tower.modules():
        for name, value in vars(module).items():
            if isinstance(value, _PLAIN):
                attributes.append((name, value))
            elif isinstance(value, torch.Tensor):  # a tensor attribute that is not a registered buffer
                tensors.append(value)
    return tensors, [tensor._version for tensor in tensors], attributes


def _same_state(kept, state):
    return (len(kept[0]) == len(state[0]) and all(a is b for a, b in zip(kept[0], state[0]))
            and kept[1] == state[1] and kept[2] == state[2])


def _equal(a, b):
    """Structural equality of keys: tensors by dtype, shape, device and value; sequences item by item."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.device == b.device and bool(torch.equal(a.detach(), b.detach())))
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(_equal(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def _copied(value):
    """``value`` with every tensor in it detached and cloned (tuples, lists, dicts, TowerOutput-like dataclasses)."""
    return map_tensors(lambda tensor: tensor.detach().clone(), value)


def _needs_grad(value):
    return any(tensor.requires_grad for tensor in nested_tensors(value))


@functools.lru_cache(maxsize=None)
def _pure_edits():
    """{edit class: the attributes that, with the hidden states and the run state, make its result}:
    the runner's token insertion and replacement, and MMRL++'s blend of later representation tokens."""
    from trainers.mmrlpp import BlendTokens

    return {InsertTokens: ("tokens", "at", "keep_length"), ReplaceTokens: ("tokens", "at"),
            BlendTokens: ("tokens", "beta", "at")}


def _edit_key(edit):
    fields = _pure_edits().get(type(edit))
    if fields is None:
        raise _Uncacheable(type(edit).__name__)
    return (type(edit).__name__, *(getattr(edit, name) for name in fields))


def _plan_key(plan):
    """A comparable form of ``plan`` (raises _Uncacheable for an edit not in ``_pure_edits`` and for
    parallel branches)."""
    if plan is EMPTY_PLAN:
        return ("empty",)
    if type(plan) is not Plan or plan.parallel:
        raise _Uncacheable("plan")
    layers = []
    for index in sorted(plan.layers):
        layers.append((index, tuple(_edit_key(edit) for edit in plan.edits_at(index))))
    return ("plan", tuple(_edit_key(edit) for edit in plan.embed), tuple(layers),
            tuple((index, plan.masks[index]) for index in sorted(plan.masks)))


def _rows_key(rows):
    if rows is None:
        return None
    if isinstance(rows, (range, tuple, list)) and all(isinstance(row, int) for row in rows):
        return ("rows", tuple(rows))
    raise _Uncacheable("rows")


def _autocast(tensor):
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
          "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")


def _hooked(tower):
    """Whether a module hook (global, or on one of ``tower``'s modules) could see or change a run."""
    from torch.nn.modules import module as torch_module

    if any(getattr(torch_module, name, None) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks", "_global_forward_hooks_always_called")):
        return True
    return any(getattr(module, name, None) for module in tower.modules() for name in _HOOKS)


def _kept_run(tower, key, grad_inputs, compute):
    """``compute()`` through ``tower``'s KeptRuns when the run needs no gradient and no hook is set,
    else ``compute()``."""
    if torch.is_grad_enabled() and (any(t.requires_grad for t in nested_tensors(list(grad_inputs)))
                                    or any(p.requires_grad for p in tower.parameters())):
        return compute()
    if _hooked(tower):
        return compute()
    return tower.kept_runs.run(tower, key, compute)


class _KeptVision:
    """Mixed into an image tower's class: ``forward`` (from images, or from hidden states at a block)
    and ``run_prefix`` keep their results."""

    def forward(self, images=None, plan=EMPTY_PLAN, hidden=None, start=0, rows=None, prefix=None, pool_keys=None):
        compute = functools.partial(super().forward, images, plan, hidden, start, rows, prefix, pool_keys)
        source = images if hidden is None else hidden
        if source is None or prefix is not None or pool_keys is not None:
            return compute()
        try:
            key = ("forward", images, hidden, None if hidden is None else int(start), _plan_key(plan),
                   _rows_key(rows), _autocast(source))
        except _Uncacheable:
            return compute()
        return _kept_run(self, key, [images, hidden, key[4]], compute)

    def run_prefix(self, images, stop):
        key = ("prefix", images, min(stop, self.num_layers), _autocast(images))
        return _kept_run(self, key, [images], functools.partial(super().run_prefix, images, stop))


class _KeptText:
    """Mixed into a text tower's class: ``forward`` (from token ids or embeddings, or from hidden
    states at a block) keeps its results."""

    def forward(self, token_ids=None, plan=EMPTY_PLAN, embeddings=None, eot=None, all_tokens=False, hidden=None,
                start=0, last=None):
        compute = functools.partial(super().forward, token_ids, plan, embeddings, eot, all_tokens, hidden, start,
                                    last)
        source = token_ids if embeddings is None else embeddings
        if source is None:
            return compute()
        try:
            key = ("forward", token_ids, embeddings, eot, hidden, None if hidden is None else int(start),
                   _plan_key(plan), bool(all_tokens), _autocast(source), None if last is None else int(last))
        except _Uncacheable:
            return compute()
        return _kept_run(self, key, [token_ids, embeddings, eot, hidden, key[6]], compute)


@functools.lru_cache(maxsize=None)
def _kept_class(mixin, cls):
    return type(f"Kept{cls.__name__}", (mixin, cls), {"__module__": __name__})


def _keep(tower, mixin):
    if tower is not None and not hasattr(tower, "kept_runs"):
        tower.__class__ = _kept_class(mixin, type(tower))
        tower.kept_runs = KeptRuns()


def keep_tower_runs(runner):
    """Make ``runner``'s (a CLIPRunner) image and text towers keep their runs (see the module
    docstring); returns ``runner``."""
    _keep(runner.visual, _KeptVision)
    _keep(runner.text, _KeptText)
    return runner


def kept_run_counts(runner):
    """{"hits", "misses"} of ``runner``'s towers together (for measuring what the keeping saves)."""
    towers = [tower for tower in (runner.visual, runner.text) if tower is not None and hasattr(tower, "kept_runs")]
    return {"hits": sum(t.kept_runs.hits for t in towers), "misses": sum(t.kept_runs.misses for t in towers)}

