"""Tensors inside nested values: a model's outputs as tuples, lists, dicts and dataclasses
(e.g. a tower's ``TowerOutput``) holding tensors."""
import dataclasses

import torch

__all__ = ["map_tensors", "nested_tensors"]


def map_tensors(function, value):
    """``value`` rebuilt with ``function(tensor)`` in place of every tensor it holds (in tuples,
    lists, dicts and dataclass instances, at any depth); anything else is kept as it is."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, (tuple, list)):
        items = [map_tensors(function, item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple takes fields
    if isinstance(value, dict):
        return {key: map_tensors(function, item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{field.name: map_tensors(function, getattr(value, field.name))
                                             for field in dataclasses.fields(value) if field.init})
    return value


def nested_tensors(value):
    """The tensors ``value`` holds, in the order :func:`map_tensors` visits them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from nested_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from nested_tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from nested_tensors(getattr(value, field.name))
