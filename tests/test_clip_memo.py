"""tests/clip_memo.py (installed for every test process by conftest.py): a memoised construction or
weights read gives what the unwrapped open_clip functions give, generator state included."""
import open_clip
import open_clip.factory as factory
import torch

import clip_memo
from vlprompt.clip.loading import backbone_config, resolve_model_name


def test_the_memo_is_installed():
    assert clip_memo.ORIGINALS and open_clip.create_model is not clip_memo.ORIGINALS["create_model"]


def test_a_repeated_construction_equals_a_new_one_and_advances_the_generator_alike(tiny_clip_files):
    config, _ = tiny_clip_files
    name, _ = resolve_model_name(config)
    backbone_config(config)
    results = []
    for create in (open_clip.create_model, open_clip.create_model, clip_memo.ORIGINALS["create_model"]):
        torch.manual_seed(3)
        model = create(name, pretrained=None, force_quick_gelu=True)
        results.append((model, {key: value.clone() for key, value in model.state_dict().items()}, torch.rand(4)))
        with torch.no_grad():  # a caller changing its model changes no later construction
            for parameter in model.parameters():
                parameter.add_(1.0)
    (first, first_state, after_first), (second, second_state, after_second), (_, fresh_state, after_fresh) = results
    assert second is not first
    assert torch.equal(after_first, after_fresh) and torch.equal(after_second, after_fresh)
    for state in (first_state, second_state):
        assert state.keys() == fresh_state.keys()
        assert all(torch.equal(state[key], fresh_state[key]) for key in fresh_state)
    torch.manual_seed(4)  # another generator state: another model
    other = open_clip.create_model(name, pretrained=None, force_quick_gelu=True)
    assert not torch.equal(other.state_dict()["visual.conv1.weight"], fresh_state["visual.conv1.weight"])


def test_a_weights_file_rewritten_in_place_is_read_again(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, path)
    first = factory.load_state_dict(str(path))
    first["w"] += 1  # a caller changing what it read changes no later read
    assert torch.equal(factory.load_state_dict(str(path))["w"], torch.zeros(3))
    with open(path, "r+b") as f:  # same name, size and inode, other bytes
        data = f.read()
        f.seek(0)
        torch.save({"w": torch.ones(3)}, f)
        assert f.tell() == len(data)
    assert torch.equal(factory.load_state_dict(str(path))["w"], torch.ones(3))
    assert torch.equal(clip_memo.ORIGINALS["load_state_dict"](str(path))["w"], torch.ones(3))


def test_kept_loads_give_equal_models_of_their_own_and_leave_the_generator_as_found(tiny_clip_files):
    """tests/clip_loads.py (the registry-wide contracts' per-module loads): a kept load is a deep copy
    equal to a fresh load, what a test changes in its copy reaches no later load, torch's generator is
    where it was, and a load at another input size is passed through unkept."""
    from clip_loads import keeping_loads
    from vlprompt.clip import load_clip

    config, weights = tiny_clip_files
    load = keeping_loads(load_clip)
    fresh = load_clip(config, weights)[0].state_dict()
    generator = torch.random.get_rng_state()
    first = load(config, weights)[0]
    assert torch.equal(torch.random.get_rng_state(), generator)
    with torch.no_grad():
        next(first.parameters()).add_(1.0)
    second = load(config, weights)[0]
    assert second is not first and torch.equal(torch.random.get_rng_state(), generator)
    assert all(torch.equal(value, fresh[key]) for key, value in second.state_dict().items())
    assert tuple(load(config, "random", image_size=48)[0].visual.image_size) == (48, 48)
