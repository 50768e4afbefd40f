"""DataManager, DatasetWrapper, build_data_loader, samplers and transforms."""
import json
import os

import pytest
import torch
from PIL import Image

import datasets  # noqa: F401  (registers DescribableTextures)
from vlprompt.config import get_cfg_default
from vlprompt.data import DataManager, DatasetWrapper, build_data_loader
from vlprompt.data.datasets import DATASET_REGISTRY, DatasetBase, Datum
from vlprompt.data.transforms import build_transform

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
NORMALIZE_LINE = f"+ normalization (mean={CLIP_MEAN}, std={CLIP_STD})"


def _jpeg(path, shade):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (8, 8), (shade, 255 - shade, (7 * shade) % 256)).save(path, "JPEG")
    return str(path)


def _dtd_with_split(root, n_train=10, n_val=4, n_test=6):
    """dtd/ with two categories and a hand-written split JSON."""
    images = os.path.join(root, "dtd", "images")
    split = {"train": [], "val": [], "test": []}
    index = 0
    for part, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        for i in range(n):
            category = ("banded", "blotchy")[i % 2]
            name = f"{category}/{category}_{index:04d}.jpg"
            _jpeg(os.path.join(images, name), shade=index * 9)
            split[part].append([name, i % 2, category])
            index += 1
    with open(os.path.join(root, "dtd", "split_zhou_DescribableTextures.json"), "w") as f:
        json.dump(split, f)


def _cfg(root, train_batch=4, test_batch=100, workers=0):
    cfg = get_cfg_default()
    cfg.DATASET.ROOT = str(root)
    cfg.DATASET.NAME = "DescribableTextures"
    cfg.INPUT.SIZE = (16, 16)
    cfg.INPUT.INTERPOLATION = "bicubic"
    cfg.INPUT.TRANSFORMS = ["random_resized_crop", "random_flip", "normalize"]
    cfg.INPUT.PIXEL_MEAN = CLIP_MEAN
    cfg.INPUT.PIXEL_STD = CLIP_STD
    cfg.DATALOADER.NUM_WORKERS = workers
    cfg.DATALOADER.TRAIN_X.BATCH_SIZE = train_batch
    cfg.DATALOADER.TEST.BATCH_SIZE = test_batch
    cfg.VERBOSE = False
    return cfg


# ---------------------------------------------------------------- DataManager

def test_data_manager_loaders_batch_counts_and_shapes(tmp_path):
    _dtd_with_split(tmp_path)
    dm = DataManager(_cfg(tmp_path, train_batch=4))
    assert dm.num_classes == 2 and dm.lab2cname == {0: "banded", 1: "blotchy"}
    assert dm.num_source_domains == 0 and dm.train_loader_u is None
    assert len(dm.train_loader_x) == 2  # floor(10 / 4), last partial batch dropped
    assert len(dm.val_loader) == 1 and len(dm.test_loader) == 1

    batch = next(iter(dm.train_loader_x))
    assert set(batch) == {"img", "label", "domain", "impath", "index"}
    assert batch["img"].shape == (4, 3, 16, 16) and batch["img"].dtype == torch.float32
    assert batch["label"].shape == (4,)
    test_batch = next(iter(dm.test_loader))
    assert test_batch["img"].shape == (6, 3, 16, 16)
    assert test_batch["index"].tolist() == list(range(6))


def test_small_training_set_keeps_one_partial_batch(tmp_path):
    _dtd_with_split(tmp_path, n_train=3)
    dm = DataManager(_cfg(tmp_path, train_batch=32))
    batches = list(dm.train_loader_x)
    assert len(batches) == 1 and batches[0]["img"].shape[0] == 3


def test_verbose_prints_transforms_and_table(tmp_path, capsys):
    _dtd_with_split(tmp_path)
    cfg = _cfg(tmp_path)
    cfg.VERBOSE = True
    DataManager(cfg)
    assert capsys.readouterr().out == "\n".join(
        [
            "Loading dataset: DescribableTextures",
            f"Reading split from {tmp_path}/dtd/split_zhou_DescribableTextures.json",
            "DATASET.NUM_SHOTS is -1: all 10 training images are used (no few-shot sampling)",
            "Building transform_train",
            "+ random resized crop (size=(16, 16), scale=(0.08, 1.0))",
            "+ random flip",
            "+ to torch tensor of range [0, 1]",
            NORMALIZE_LINE,
            "Building transform_test",
            "+ resize the smaller edge to 16",
            "+ 16x16 center crop",
            "+ to torch tensor of range [0, 1]",
            NORMALIZE_LINE,
            "---------  -------------------",
            "Dataset    DescribableTextures",
            "# classes  2",
            "# train_x  10",
            "# val      4",
            "# test     6",
            "---------  -------------------",
            "",
        ]
    )


@DATASET_REGISTRY.register(force=True)
class ToyThousands(DatasetBase):
    """1,234 training items that are never read (DataManager does not open images)."""

    def __init__(self, cfg):
        items = [Datum.unchecked(f"/nonexistent/{i}.jpg", i % 3, 0, f"c{i % 3}") for i in range(1234)]
        super().__init__(train_x=items, test=items[:5])


def test_table_uses_thousands_separator_and_skips_empty_val(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    cfg.DATASET.NAME = "ToyThousands"
    cfg.DATASET.SOURCE_DOMAINS = ["photo"]
    dm = DataManager(cfg, custom_tfm_train=build_transform(cfg, is_train=False), custom_tfm_test=lambda img: img)
    assert dm.val_loader is None and dm.num_source_domains == 1
    capsys.readouterr()
    dm.show_dataset_summary(cfg)
    assert capsys.readouterr().out.splitlines()[1:6] == [
        "Dataset    ToyThousands",
        "Source     ['photo']",
        "# classes  3",
        "# train_x  1,234",
        "# test     5",
    ]


def test_custom_transforms_are_announced(tmp_path, capsys):
    _dtd_with_split(tmp_path)
    cfg = _cfg(tmp_path)
    cfg.VERBOSE = True
    DataManager(cfg, custom_tfm_train=build_transform(cfg, is_train=False), custom_tfm_test=lambda img: img)
    out = capsys.readouterr().out
    assert "* Using custom transform for training\n" in out
    assert "* Using custom transform for testing\n" in out


# ---------------------------------------------------------------- DatasetWrapper / loaders

def test_wrapper_k_transforms_img0_and_transform_lists(tmp_path):
    path = _jpeg(tmp_path / "a.jpg", 40)
    cfg = _cfg(tmp_path)
    cfg.DATALOADER.K_TRANSFORMS = 3
    cfg.DATALOADER.RETURN_IMG0 = True
    tfm = build_transform(cfg, is_train=True)
    item = DatasetWrapper(cfg, [Datum(path, 1, classname="x")], transform=tfm, is_train=True)[0]
    assert isinstance(item["img"], list) and len(item["img"]) == 3
    assert all(view.shape == (3, 16, 16) for view in item["img"])
    assert item["img0"].shape == (3, 16, 16)
    assert (item["label"], item["domain"], item["impath"], item["index"]) == (1, 0, path, 0)

    evaluation = DatasetWrapper(cfg, [Datum(path, 1)], transform=[tfm, tfm], is_train=False)[0]
    assert evaluation["img"].shape == (3, 16, 16) and evaluation["img2"].shape == (3, 16, 16)

    cfg.DATALOADER.RETURN_IMG0 = False
    plain = DatasetWrapper(cfg, [Datum(path, 1)], transform=None, is_train=False)[0]
    assert isinstance(plain["img"], Image.Image) and "img0" not in plain


def _asymmetric_png(path):
    """A 16x16 RGB image whose columns all differ (a flip changes every pixel)."""
    image = Image.new("RGB", (16, 16))
    image.putdata([(16 * x, 255 - 9 * y, (37 * x + 11 * y) % 256) for y in range(16) for x in range(16)])
    image.save(path)
    return str(path)


def test_a_flip_followed_only_by_normalisation_flips_the_tensor_with_the_same_pixels_and_draws(tmp_path):
    import torchvision.transforms as T

    image = Image.open(_asymmetric_png(tmp_path / "a.png")).convert("RGB")
    cfg = _cfg(tmp_path)
    cfg.INPUT.TRANSFORMS = ["random_flip", "normalize"]
    tfm = build_transform(cfg, is_train=True)
    kinds = (T.Resize, T.ToTensor, T.Normalize, T.RandomHorizontalFlip)
    assert len(tfm.transforms) == 4 and all(isinstance(step, kind) for step, kind in zip(tfm.transforms, kinds))
    image_order = T.Compose([T.Resize((16, 16), interpolation=T.InterpolationMode.BICUBIC), T.RandomHorizontalFlip(),
                             T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)])
    outputs = []
    for transform in (tfm, image_order):
        torch.manual_seed(3)
        outputs.append([transform(image) for _ in range(12)] + [torch.rand(2)])
    flipped = [not torch.equal(view, outputs[0][0]) for view in outputs[0][:12]]
    assert any(flipped) and not all(flipped)
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    # A step after the flip that draws or mixes pixels keeps the flip on the image.
    cfg.INPUT.TRANSFORMS = ["random_flip", "normalize", "gaussian_noise"]
    steps = [type(step).__name__ for step in build_transform(cfg, is_train=True).transforms]
    assert steps == ["Resize", "RandomHorizontalFlip", "ImageToTensor", "ChannelNormalize", "GaussianNoise"]


def test_tensor_conversion_and_normalisation_give_torchvision_s_values(tmp_path):
    import torchvision.transforms as T

    from vlprompt.data.transforms.transforms import ChannelNormalize, ImageToTensor

    rgb = Image.open(_asymmetric_png(tmp_path / "a.png")).convert("RGB")
    for image in (rgb, rgb.convert("L"), rgb.convert("RGBA")):
        ours, theirs = ImageToTensor()(image), T.ToTensor()(image)
        assert torch.equal(ours, theirs) and ours.stride() == theirs.stride()
    tensor = T.ToTensor()(rgb)
    normalised = ChannelNormalize(CLIP_MEAN, CLIP_STD)(tensor)
    assert torch.equal(normalised, T.Normalize(CLIP_MEAN, CLIP_STD)(tensor))
    assert torch.equal(tensor, T.ToTensor()(rgb))  # not changed in place
    double = tensor.double()
    assert torch.equal(ChannelNormalize(CLIP_MEAN, CLIP_STD)(double), T.Normalize(CLIP_MEAN, CLIP_STD)(double))
    with pytest.raises(ValueError, match="std evaluated to zero"):
        ChannelNormalize(CLIP_MEAN, [0.2, 0.0, 0.2])(tensor)


@pytest.mark.parametrize("budget, in_worker, reads", [(None, False, 2), (0, False, 6), (None, True, 6)])
def test_wrapper_prepares_each_image_once_within_its_budget(tmp_path, monkeypatch, budget, in_worker, reads):
    """The deterministic start of the transform runs once per image (while the kept images fit the
    budget, and not in a data-loader worker, which keeps nothing); every item is still the transform of
    the image, with the same random draws, and a change to a returned tensor does not reach what is kept."""
    from vlprompt.data import data_manager
    from vlprompt.utils import read_image

    paths = [_asymmetric_png(tmp_path / "a.png"), _jpeg(tmp_path / "b.jpg", 90)]
    cfg = _cfg(tmp_path)
    cfg.INPUT.TRANSFORMS = ["random_flip", "normalize"]
    tfm = build_transform(cfg, is_train=True)
    calls = []
    monkeypatch.setattr(data_manager, "read_image", lambda path: calls.append(path) or read_image(path))
    if budget is not None:
        monkeypatch.setattr(data_manager, "PREPARED_BUDGET", budget)
    if in_worker:  # what torch.utils.data.get_worker_info() returns in a worker process
        monkeypatch.setattr(data_manager, "get_worker_info", lambda: object())
    wrapper = DatasetWrapper(cfg, [Datum(path, 0) for path in paths], transform=tfm, is_train=True)
    torch.manual_seed(5)
    items = []
    for _ in range(3):
        for index in range(2):
            items.append(wrapper[index]["img"])
            items[-1].add_(100.0)  # the caller's tensor to change
    torch.manual_seed(5)
    expected = [tfm(read_image(paths[index])) + 100.0 for _ in range(3) for index in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(items, expected))
    assert len(calls) == reads


@pytest.mark.parametrize("budget", [None, 0])
def test_an_item_reads_its_image_once_for_all_its_views(tmp_path, monkeypatch, budget):
    """With K_TRANSFORMS views of each of two transforms, an item reads its image once (none kept:
    budget 0), or not at all once it is kept; each view is still its transform of the image."""
    from vlprompt.data import data_manager
    from vlprompt.utils import read_image

    path = _asymmetric_png(tmp_path / "a.png")
    cfg = _cfg(tmp_path)
    cfg.DATALOADER.K_TRANSFORMS = 2
    cfg.INPUT.TRANSFORMS = ["random_flip", "normalize"]
    tfms = [build_transform(cfg, is_train=True), build_transform(cfg, is_train=False)]
    calls = []
    monkeypatch.setattr(data_manager, "read_image", lambda path: calls.append(path) or read_image(path))
    if budget is not None:
        monkeypatch.setattr(data_manager, "PREPARED_BUDGET", budget)
    wrapper = DatasetWrapper(cfg, [Datum(path, 0)], transform=tfms, is_train=True)
    torch.manual_seed(3)
    items = [wrapper[0] for _ in range(2)]
    assert len(calls) == (2 if budget == 0 else 1)
    torch.manual_seed(3)
    image = read_image(path)
    for item in items:
        expected = [[tfm(image) for _ in range(2)] for tfm in tfms]
        assert all(torch.equal(a, b) for a, b in zip(item["img"] + item["img2"], expected[0] + expected[1]))


def test_wrapper_rejects_k_transforms_without_transform(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.DATALOADER.K_TRANSFORMS = 2
    with pytest.raises(ValueError, match="Cannot augment the image 2 times"):
        DatasetWrapper(cfg, [], transform=None, is_train=True)


def test_unreadable_image_error_names_the_path(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg at all")
    cfg = _cfg(tmp_path)
    wrapper = DatasetWrapper(cfg, [Datum(str(bad), 0)], transform=build_transform(cfg, is_train=False))
    with pytest.raises(OSError, match="broken.jpg"):
        wrapper[0]


def test_build_data_loader_errors(tmp_path):
    cfg = _cfg(tmp_path)
    with pytest.raises(ValueError, match="Cannot build a training data loader: the data source is empty"):
        build_data_loader(cfg, sampler_type="RandomSampler", data_source=[], batch_size=4, is_train=True)
    items = [Datum(_jpeg(tmp_path / "x.jpg", 1), 0)]
    with pytest.raises(ValueError, match="Unknown sampler type: Shuffle"):
        build_data_loader(cfg, sampler_type="Shuffle", data_source=items, batch_size=4)
    with pytest.raises(NotImplementedError, match="RandomDomainSampler"):
        build_data_loader(cfg, sampler_type="RandomDomainSampler", data_source=items, batch_size=4)


def _epoch(loader):
    batches = list(loader)
    return torch.cat([b["img"] for b in batches]), torch.cat([b["index"] for b in batches])


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_rng_state_reproduces_shuffling_and_augmentation(tmp_path, workers):
    items = [Datum(_jpeg(tmp_path / f"{i}.jpg", 20 * i), i % 2) for i in range(8)]
    cfg = _cfg(tmp_path, workers=workers)
    loader = build_data_loader(
        cfg, "RandomSampler", items, batch_size=4, tfm=build_transform(cfg, is_train=True), is_train=True
    )
    torch.manual_seed(0)
    first_imgs, first_order = _epoch(loader)
    state = torch.get_rng_state()
    second_imgs, second_order = _epoch(loader)

    torch.manual_seed(0)
    replay_imgs, replay_order = _epoch(loader)
    assert torch.equal(replay_order, first_order) and torch.equal(replay_imgs, first_imgs)

    torch.set_rng_state(state)  # e.g. restored from a checkpoint after epoch 1
    resumed_imgs, resumed_order = _epoch(loader)
    assert torch.equal(resumed_order, second_order) and torch.equal(resumed_imgs, second_imgs)
    assert not torch.equal(first_imgs, second_imgs)


# ---------------------------------------------------------------- transforms

def test_no_transform_and_invalid_choices(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    cfg.INPUT.NO_TRANSFORM = True
    assert build_transform(cfg, is_train=True) is None
    assert capsys.readouterr().out == "Note: no transform is applied!\n"
    cfg.INPUT.NO_TRANSFORM = False
    with pytest.raises(ValueError, match=r"unknown transform\(s\) \['flip'\]; valid names are \['random_flip'"):
        build_transform(cfg, is_train=True, choices=["flip"])
    with pytest.raises(NotImplementedError, match=r"\['randaugment'\].*not implemented"):
        build_transform(cfg, is_train=True, choices=["random_flip", "randaugment"])
    cfg.INPUT.INTERPOLATION = "lanczos"
    with pytest.raises(ValueError, match=r"INPUT.INTERPOLATION is \"lanczos\"; valid values are \['bilinear'"):
        build_transform(cfg, is_train=False)


def test_all_implemented_train_transforms_in_fixed_order(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    choices = [
        "instance_norm", "gaussian_noise", "cutout", "gaussian_blur", "randomgrayscale",
        "colorjitter", "random_flip", "random_translation", "center_crop",
    ]
    tfm = build_transform(cfg, is_train=True, choices=choices)
    assert capsys.readouterr().out.splitlines() == [
        "Building transform_train",
        "+ resize to 16x16",
        "+ random translation",
        "+ random flip",
        "+ color jitter (brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)",
        "+ random gray scale",
        "+ gaussian blur (kernel=21)",
        "+ to torch tensor of range [0, 1]",
        "+ cutout (n_holes=1, length=16)",
        "+ gaussian noise (mean=0.0, std=0.15)",
        "+ instance normalization",
    ]
    torch.manual_seed(0)
    out = tfm(Image.new("RGB", (20, 12), (10, 200, 90)))
    assert out.shape == (3, 16, 16)

    crop = build_transform(cfg, is_train=True, choices=["random_crop"])
    assert "+ random crop (padding = 4)" in capsys.readouterr().out
    assert crop(Image.new("RGB", (16, 16))).shape == (3, 16, 16)


def test_test_transform_resizes_short_side_then_center_crops(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.INPUT.TRANSFORMS = []
    image = Image.new("RGB", (32, 16), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 8, 16))  # white left quarter, cropped away by the center crop
    out = build_transform(cfg, is_train=False)(image)
    assert out.shape == (3, 16, 16)
    assert out.max().item() < 0.05
