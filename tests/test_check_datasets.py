"""tools/check_datasets.py on a root with a complete, an incomplete and a corrupt dataset."""
import os

import pytest

from mini_datasets import write_dtd, write_eurosat, write_imagenet_a, write_objectnet, write_oxford_pets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from vlprompt_app.commands import check_datasets


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """EuroSAT complete; DTD without its split JSON; OxfordPets with one corrupt and one truncated image."""
    root = tmp_path_factory.mktemp("checked")
    write_eurosat(str(root))
    write_dtd(str(root))
    os.remove(root / "dtd" / "split_zhou_DescribableTextures.json")
    write_oxford_pets(str(root))
    with open(root / "oxford_pets" / "images" / "Bengal_2.jpg", "wb") as f:
        f.write(b"this is not an image")
    truncated = root / "oxford_pets" / "images" / "Egyptian_Mau_7.jpg"
    truncated.write_bytes(truncated.read_bytes()[:200])
    return root


def _lines(output, name):
    """The report lines of one dataset (its head line and the indented lines below it)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(name + " "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return lines[start:end]


def test_report_of_all_sixteen(data_root, capsys):
    assert check_datasets.main(["--root", str(data_root), "--workers", "2"]) == 1
    out = capsys.readouterr().out

    eurosat = _lines(out, "EuroSAT")
    assert eurosat[0].split()[:2] == ["EuroSAT", "OK"]
    assert "eurosat/  4 classes; train 12, val 8, test 8" in eurosat[0]
    assert "note:  the published split has train 13,500, val 5,400, test 8,100; this copy differs" in eurosat[1]

    dtd = _lines(out, "DescribableTextures")
    assert dtd[0].split()[:3] == ["DescribableTextures", "BROKEN", "dtd/"]
    assert "fault: split_zhou_DescribableTextures.json is missing: a run would build its own split" in dtd[1]
    assert not os.path.exists(data_root / "dtd" / "split_zhou_DescribableTextures.json")  # nothing was built

    pets = _lines(out, "OxfordPets")
    assert pets[0].split()[:2] == ["OxfordPets", "BROKEN"] and "5 classes; train 15, val 10, test 10" in pets[0]
    assert "fault: 2 of 35 images cannot be read:" in pets[1]
    assert "Bengal_2.jpg (UnidentifiedImageError: cannot identify image file" in pets[2]
    assert "Egyptian_Mau_7.jpg (" in pets[3]

    assert _lines(out, "ImageNet")[0].split()[:2] == ["ImageNet", "MISSING"]
    assert 'no folder "imagenet-adversarial" or "imagenet-a"' in _lines(out, "ImageNetA")[0]
    assert _lines(out, "ObjectNet")[0].split()[:2] == ["ObjectNet", "MISSING"]
    assert "1 ok, 2 broken, 13 missing" in out
    assert "Unusable: OxfordPets, DescribableTextures" in out  # benchmark order


def test_exit_status_follows_the_requested_datasets(data_root, capsys):
    assert check_datasets.main(["--root", str(data_root), "--datasets", "eurosat", "--workers", "1"]) == 0
    assert check_datasets.main(["--root", str(data_root), "--datasets", "EuroSAT", "dtd", "--images", "off"]) == 1
    assert check_datasets.main(["--root", str(data_root), "--datasets", "oxford_pets", "--images", "decode"]) == 1
    assert check_datasets.main(["--root", str(data_root), "--datasets", "OxfordPets", "--images", "off"]) == 0
    assert check_datasets.main(["--root", str(data_root), "--datasets", "imagenet_r"]) == 1
    out = capsys.readouterr().out
    assert "ImageNetR            MISSING  no folder" in out
    with pytest.raises(SystemExit, match=r"Unknown dataset\(s\) \['eurosatt'\]"):
        check_datasets.main(["--root", str(data_root), "--datasets", "eurosatt"])


def test_missing_layout_parts_and_images_are_named(tmp_path, capsys):
    write_imagenet_a(str(tmp_path))
    os.remove(tmp_path / "imagenet-adversarial" / "classnames.txt")
    write_eurosat(str(tmp_path))
    os.remove(tmp_path / "eurosat" / "2750" / "Forest" / "Forest_7.jpg")
    assert check_datasets.main(["--root", str(tmp_path), "--datasets", "ImageNetA", "EuroSAT"]) == 1
    out = capsys.readouterr().out
    assert "fault: missing classnames.txt" in _lines(out, "ImageNetA")[1]
    eurosat = "\n".join(_lines(out, "EuroSAT"))
    assert "1 of 8 images listed in the \"test\" list of" in eurosat and "Forest/Forest_7.jpg" in eurosat



def test_objectnet_is_checked(tmp_path, capsys):
    """A complete ObjectNet is OK with its 113-class summary form; a lost mapping file is a named fault."""
    write_objectnet(str(tmp_path))
    assert check_datasets.main(["--root", str(tmp_path), "--datasets", "objectnet"]) == 0
    head = _lines(capsys.readouterr().out, "ObjectNet")
    assert head[0].split()[:3] == ["ObjectNet", "OK", "objectnet/"] and "3 classes; 6 test images (test only)" in head[0]
    assert "note:  the published split has test 18,574; this copy differs" in head[1]

    os.remove(tmp_path / "objectnet" / "objectnet-1.0" / "mappings" / "objectnet_to_imagenet_1k.json")
    assert check_datasets.main(["--root", str(tmp_path), "--datasets", "ObjectNet"]) == 1
    assert "fault: missing objectnet-1.0/mappings/objectnet_to_imagenet_1k.json" in capsys.readouterr().out
