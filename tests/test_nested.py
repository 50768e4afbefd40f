"""vlprompt.utils.nested: the one walk over the tensors of nested outputs (compiled steps' copies,
the fidelity harness's kept runs, the device-placement check)."""
import collections
import dataclasses

import torch

from vlprompt.utils import map_tensors, nested_tensors

Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class Output:
    features: torch.Tensor
    extra: tuple
    name: str = "out"


def test_map_tensors_rebuilds_every_container_around_new_tensors():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    value = {"pair": Pair(a, [b, 3]), "output": Output(c, (d, None))}
    doubled = map_tensors(lambda tensor: tensor * 2, value)
    assert type(doubled["pair"]) is Pair and type(doubled["output"]) is Output and doubled["output"].name == "out"
    assert doubled["pair"].second[1] == 3 and doubled["output"].extra[1] is None
    assert [t.tolist() for t in nested_tensors(doubled)] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
    assert [t is s for t, s in zip(nested_tensors(value), (a, b, c, d))] == [True] * 4  # the input is untouched
    copies = map_tensors(torch.Tensor.clone, value)
    assert all(t is not s and torch.equal(t, s) for t, s in zip(nested_tensors(copies), nested_tensors(value)))
