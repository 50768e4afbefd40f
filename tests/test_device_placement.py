"""The device-placement check of vlprompt_app/benchmarking/device_placement.py: what it flags
(a tensor made without the data's device that meets the data, directly or after arithmetic)
and what it lets pass (the data's device, ``new_*``/``*_like``, ``.to(device)``, 0-dim
tensors, tensors made before the check). The check over every trainer's step runs in
tests/test_mixed_precision.py."""
import torch

from vlprompt_app.benchmarking.device_placement import DevicelessTensorCheck, Fault


def here():
    """This file's name and the line of the caller."""
    import inspect

    frame = inspect.currentframe().f_back
    return f"{__file__}:{frame.f_lineno}"


def test_a_deviceless_tensor_meeting_the_data_is_a_fault():
    x = torch.randn(3, 4)
    with DevicelessTensorCheck() as check:
        zeros = torch.zeros(4); origin = here()  # noqa: E702  (the origin is this line)
        x + zeros
    assert check.faults == [Fault(origin, "add")]


def test_the_mark_follows_arithmetic_and_indexing():
    x = torch.randn(3, 4)
    with DevicelessTensorCheck() as check:
        index = torch.arange(3); origin = here()  # noqa: E702
        x[index * 1]
    assert check.faults == [Fault(origin, "__getitem__")]


def test_a_cast_without_a_device_keeps_the_mark():
    x = torch.randn(3, 4)
    with DevicelessTensorCheck() as check:
        noise = torch.randn(4, generator=torch.Generator().manual_seed(0)); origin = here()  # noqa: E702
        x.half() + noise.to(torch.float16)
    assert check.faults == [Fault(origin, "add")]


def test_tensors_placed_with_the_data_pass():
    x = torch.randn(3, 4)
    weight = torch.ones(4)  # made before the check, like a buffer
    with DevicelessTensorCheck() as check:
        x + torch.zeros(4, device=x.device)
        x + torch.ones(4).to(x.device)
        x + torch.randn(4, generator=torch.Generator().manual_seed(0)).to(x)
        x + x.new_zeros(4)
        x + torch.zeros_like(x)
        x * torch.tensor(2.0)
        x * weight
        torch.arange(3) * 2  # deviceless tensors among themselves
    assert check.faults == []


def test_random_draws_with_the_data_device_generator_are_recorded():
    x = torch.randn(3, 4)
    with DevicelessTensorCheck() as check:
        torch.nn.functional.dropout(x, 0.3, training=True); dropout = here()  # noqa: E702
        torch.rand_like(x); like = here()  # noqa: E702
        torch.randn(4, device=x.device); on_device = here()  # noqa: E702
        x.clone().normal_(); in_place = here()  # noqa: E702
    assert check.device_draws == [Fault(dropout, "dropout"), Fault(like, "rand_like"),
                                  Fault(on_device, "randn"), Fault(in_place, "normal_")]
    assert check.faults == []


def test_random_draws_on_the_cpu_then_moved_pass():
    x = torch.randn(3, 4)
    with DevicelessTensorCheck() as check:
        torch.nn.functional.dropout(x, 0.3, training=False)
        torch.nn.functional.dropout(x, 0.0, training=True)
        keep = (torch.rand(x.shape) >= 0.3).to(x.device, x.dtype)
        x * keep
        torch.empty(4).normal_()  # drawn on a tensor made on the CPU
    assert check.device_draws == [] and check.faults == []
