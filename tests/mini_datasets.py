"""Miniature copies of the on-disk layouts of the 15 benchmark datasets and ObjectNet.

Each `write_<yaml stem>(root)` writes the dataset's folder under `root` with its real
file and folder names, its real annotation files (text lists, .mat files, JSON name
maps) and, where the dataset has one, a split JSON in the published record format
`[relative_path, label, classname]`. Every class gets PER_CLASS = (3, 2, 2) images for
train / val / test (test-only datasets: 2 images per class). Images are 8x8 JPEGs (ObjectNet:
10x10 PNGs whose 1-pixel red frame surrounds a blue picture, as the release frames its photos).

Each writer returns a `Mini(classnames, sizes)`: the expected class names in label
order and the expected (train, val, test) sizes of the full dataset.
"""
import io
import json
import os
from collections import namedtuple

from PIL import Image

from vlprompt.config import get_cfg_default

PER_CLASS = {"train": 3, "val": 2, "test": 2}
TEST_ONLY_PER_CLASS = 2

Mini = namedtuple("Mini", "classnames sizes")

_JPEG_CACHE = {}


def cfg_for(root, name, shots=-1, subsample="all", seed=1):
    """A default config reading dataset `name` under `root` (quiet)."""
    cfg = get_cfg_default()
    cfg.DATASET.ROOT = str(root)
    cfg.DATASET.NAME = name
    cfg.DATASET.NUM_SHOTS = shots
    cfg.DATASET.SUBSAMPLE_CLASSES = subsample
    cfg.SEED = seed
    cfg.VERBOSE = False
    return cfg


def jpeg_bytes(shade):
    """Bytes of an 8x8 JPEG of a shade-dependent colour."""
    if shade not in _JPEG_CACHE:
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (shade % 256, (255 - 3 * shade) % 256, (7 * shade) % 256)).save(buffer, "JPEG")
        _JPEG_CACHE[shade] = buffer.getvalue()
    return _JPEG_CACHE[shade]


def write_image(path, shade=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(jpeg_bytes(shade))
    return path


def write_text(path, lines, newline="\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write("".join(line + newline for line in lines))
    return path


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=4)
    return path


def _per_class_split(image_dir, classes):
    """Write the images of `classes` [(classname, [7 relative paths])] and return the split dict.

    Per class: the first 3 paths go to train, the next 2 to val, the last 2 to test;
    labels are the positions in `classes`.
    """
    split = {"train": [], "val": [], "test": []}
    for label, (classname, paths) in enumerate(classes):
        cursor = 0
        for part, count in PER_CLASS.items():
            for relative in paths[cursor : cursor + count]:
                write_image(os.path.join(image_dir, relative), shade=7 * label + cursor)
                split[part].append([relative, label, classname])
                cursor += 1
    return split


def _split_dataset(root, folder, prefix, split_file, classes):
    """A dataset whose split JSON (paths relative to `prefix`) lists all its images."""
    base = os.path.join(root, folder)
    split = _per_class_split(os.path.join(base, prefix), classes)
    write_json(os.path.join(base, split_file), split)
    return Mini([name for name, _ in classes], _sizes(len(classes)))


def _sizes(n_classes):
    return tuple(PER_CLASS[part] * n_classes for part in ("train", "val", "test"))


def _numbered(pattern, n=7, start=1):
    return [pattern.format(i) for i in range(start, start + n)]


# ---------------------------------------------------------------- the eleven training datasets

IMAGENET_CLASSES = [
    ("n01440764", "tench"),
    ("n01443537", "goldfish"),
    ("n01484850", "great white shark"),
    ("n01491361", "tiger shark"),
    ("n01494475", "hammerhead shark"),
]


def write_classnames(path, classes=IMAGENET_CLASSES):
    return write_text(path, [f"{wnid} {name}" for wnid, name in classes])


def write_imagenet(root, classes=IMAGENET_CLASSES):
    """imagenet/images/{train,val}/<wnid>/ and classnames.txt (no cache yet) for `classes` [(wnid, name)]."""
    base = os.path.join(root, "imagenet")
    for label, (wnid, _) in enumerate(classes):
        for i in range(PER_CLASS["train"]):
            write_image(os.path.join(base, "images", "train", wnid, f"{wnid}_{1000 + i}.JPEG"), 3 * label + i)
        for i in range(PER_CLASS["test"]):
            write_image(os.path.join(base, "images", "val", wnid, f"ILSVRC2012_val_{label * 10 + i:08d}.JPEG"), i)
    write_classnames(os.path.join(base, "classnames.txt"), classes)
    n = len(classes)
    return Mini([name for _, name in classes], (PER_CLASS["train"] * n, PER_CLASS["test"] * n, PER_CLASS["test"] * n))


CALTECH_CLASSES = [("face", "Faces"), ("leopard", "Leopards"), ("accordion", "accordion"),
                   ("airplane", "airplanes"), ("yin_yang", "yin_yang")]


def write_caltech101(root):
    classes = [(name, _numbered(folder + "/image_{:04d}.jpg")) for name, folder in CALTECH_CLASSES]
    return _split_dataset(root, "caltech-101", "101_ObjectCategories", "split_zhou_Caltech101.json", classes)


PETS_CLASSES = ["Abyssinian", "american_bulldog", "Bengal", "Egyptian_Mau", "yorkshire_terrier"]


def write_oxford_pets(root):
    classes = [(breed.lower(), _numbered(breed + "_{}.jpg")) for breed in PETS_CLASSES]
    return _split_dataset(root, "oxford_pets", "images", "split_zhou_OxfordPets.json", classes)


CARS_META = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi V8 Sedan 1994", "BMW M3 Coupe 2012"]


def write_stanford_cars(root):
    """Split entries are relative to the dataset folder: cars_train/NNNNN.jpg, cars_test/NNNNN.jpg."""
    classes = []
    for label, meta in enumerate(CARS_META):
        words = meta.split(" ")
        train_files = [f"cars_train/{5 * label + i + 1:05d}.jpg" for i in range(5)]
        test_files = [f"cars_test/{2 * label + i + 1:05d}.jpg" for i in range(2)]
        classes.append((" ".join([words[-1], *words[:-1]]), train_files + test_files))
    return _split_dataset(root, "stanford_cars", "", "split_zhou_StanfordCars.json", classes)


FLOWER_NAMES = {"1": "pink primrose", "2": "hard-leaved pocket orchid", "3": "canterbury bells",
                "4": "sweet pea", "5": "english marigold"}


def write_oxford_flowers(root):
    classes = [(FLOWER_NAMES[str(k)], [f"image_{7 * (k - 1) + i:05d}.jpg" for i in range(1, 8)])
               for k in range(1, 6)]
    mini = _split_dataset(root, "oxford_flowers", "jpg", "split_zhou_OxfordFlowers.json", classes)
    write_json(os.path.join(root, "oxford_flowers", "cat_to_name.json"), FLOWER_NAMES)
    return mini


FOOD_CLASSES = ["apple_pie", "baby_back_ribs", "baklava", "beef_carpaccio", "beet_salad"]


def write_food101(root):
    classes = [(name, [f"{name}/{100000 + 37 * i + label}.jpg" for i in range(7)])
               for label, name in enumerate(FOOD_CLASSES)]
    mini = _split_dataset(root, "food-101", "images", "split_zhou_Food101.json", classes)
    write_text(os.path.join(root, "food-101", "meta", "classes.txt"), FOOD_CLASSES)
    return mini


AIRCRAFT_VARIANTS = ["707-320", "BAE 146-200", "F-16A/B", "Falcon 2000", "Tu-134"]


def write_fgvc_aircraft(root):
    """images/<7-digit id>.jpg, variants.txt and the three official variant lists (no JSON)."""
    base = os.path.join(root, "fgvc_aircraft")
    lists = {"train": [], "val": [], "test": []}
    image_id = 1000000
    for label, variant in enumerate(AIRCRAFT_VARIANTS):
        for part, count in PER_CLASS.items():
            for _ in range(count):
                image_id += 17
                write_image(os.path.join(base, "images", f"{image_id:07d}.jpg"), label)
                lists[part].append(f"{image_id:07d} {variant}")
    write_text(os.path.join(base, "variants.txt"), AIRCRAFT_VARIANTS)
    for part, lines in lists.items():
        write_text(os.path.join(base, f"images_variant_{part}.txt"), lines)
    write_text(os.path.join(base, "families.txt"), ["Boeing 707", "BAE 146", "F-16", "Falcon 2000", "Tu-134"])
    return Mini(list(AIRCRAFT_VARIANTS), _sizes(len(AIRCRAFT_VARIANTS)))


SUN_CATEGORIES = ["a/abbey", "a/apartment_building/outdoor", "b/bakery/shop", "b/bedroom", "c/cathedral/outdoor"]
SUN_NAMES = ["abbey", "outdoor apartment_building", "shop bakery", "bedroom", "outdoor cathedral"]


def write_sun397(root):
    classes = [(name, [f"{category}/sun_{label}{'abcdefg'[i] * 3}.jpg" for i in range(7)])
               for label, (category, name) in enumerate(zip(SUN_CATEGORIES, SUN_NAMES))]
    return _split_dataset(root, "sun397", "SUN397", "split_zhou_SUN397.json", classes)


DTD_CLASSES = ["banded", "blotchy", "braided", "bubbly", "bumpy"]


def write_dtd(root):
    classes = [(name, _numbered(f"{name}/{name}_{{:04d}}.jpg", start=100)) for name in DTD_CLASSES]
    return _split_dataset(root, "dtd", "images", "split_zhou_DescribableTextures.json", classes)


EUROSAT_CLASSES = [("AnnualCrop", "Annual Crop Land"), ("Forest", "Forest"),
                   ("HerbaceousVegetation", "Herbaceous Vegetation Land"), ("Highway", "Highway or Road")]


def write_eurosat(root):
    classes = [(name, _numbered(f"{folder}/{folder}_{{}}.jpg")) for folder, name in EUROSAT_CLASSES]
    return _split_dataset(root, "eurosat", "2750", "split_zhou_EuroSAT.json", classes)


UCF_ACTIONS = [(1, "ApplyEyeMakeup"), (2, "ApplyLipstick"), (3, "Archery"), (100, "WritingOnBoard"), (101, "YoYo")]


def renamed(action):
    return {"ApplyEyeMakeup": "Apply_Eye_Makeup", "ApplyLipstick": "Apply_Lipstick", "Archery": "Archery",
            "WritingOnBoard": "Writing_On_Board", "YoYo": "Yo_Yo"}[action]


def write_ucf101(root):
    classes = [(renamed(action), [f"{renamed(action)}/v_{action}_g{g:02d}_c01.jpg" for g in range(1, 8)])
               for _, action in UCF_ACTIONS]
    return _split_dataset(root, "ucf101", "UCF-101-midframes", "split_zhou_UCF101.json", classes)


# ---------------------------------------------------------------- the four test-only variants

def write_imagenetv2(root, n_classes=12):
    """Folders 0 … n-1 (so that "10" sorts before "2" as a string) and classnames.txt."""
    base = os.path.join(root, "imagenetv2")
    classes = [(f"n0{1000000 + i}", f"class {i}") for i in range(n_classes)]
    for label in range(n_classes):
        for i in range(TEST_ONLY_PER_CLASS):
            write_image(os.path.join(base, "imagenetv2-matched-frequency-format-val", str(label),
                                     f"{label:03d}{i}f3a9c.jpeg"), label)
    write_classnames(os.path.join(base, "classnames.txt"), classes)
    n = TEST_ONLY_PER_CLASS * n_classes
    return Mini([name for _, name in classes], (n, 0, n))


def write_imagenet_sketch(root):
    base = os.path.join(root, "imagenet-sketch")
    for label, (wnid, _) in enumerate(IMAGENET_CLASSES):
        for i in range(TEST_ONLY_PER_CLASS):
            write_image(os.path.join(base, "images", wnid, f"sketch_{i}.JPEG"), label)
    write_classnames(os.path.join(base, "classnames.txt"))
    n = TEST_ONLY_PER_CLASS * len(IMAGENET_CLASSES)
    return Mini([name for _, name in IMAGENET_CLASSES], (n, 0, n))


def _subset_variant(root, folder, image_folder, wnids, file_pattern):
    """A 200-of-1000 variant: a few of ImageNet's WNID folders, README.txt, the full classnames.txt."""
    base = os.path.join(root, folder)
    names = dict(IMAGENET_CLASSES)
    for label, wnid in enumerate(sorted(wnids)):
        for i in range(TEST_ONLY_PER_CLASS):
            write_image(os.path.join(base, image_folder, wnid, file_pattern.format(i=i, name=names[wnid])), label)
    write_text(os.path.join(base, image_folder, "README.txt"), ["a README that is not a class"])
    write_classnames(os.path.join(base, "classnames.txt"))
    n = TEST_ONLY_PER_CLASS * len(wnids)
    return Mini([names[wnid] for wnid in sorted(wnids)], (n, 0, n))


def write_imagenet_a(root, folder="imagenet-adversarial"):
    return _subset_variant(root, folder, "imagenet-a", ["n01494475", "n01443537", "n01491361"],
                           "0.00{i}116_{name} _ {name}_0.86.jpg")


def write_imagenet_r(root, folder="imagenet-rendition"):
    return _subset_variant(root, folder, "imagenet-r", ["n01491361", "n01440764"], "art_{i}.jpg")


# ImageNet as ObjectNet's mapping files see it: a sixth class that no ObjectNet class covers,
# the raw names of imagenet_to_label_2012_v2 in ILSVRC-2012 id order (not the WNID order of the
# labels; two lines share the name "shark"), and pytorch_to_imagenet_2012_id.json's label -> line.
OBJECTNET_IMAGENET = IMAGENET_CLASSES + [("n01496331", "electric ray")]
OBJECTNET_IMAGENET_LINES = ["great white shark, white shark", "shark", "tench, Tinca tinca", "electric ray, crampfish",
                            "goldfish, Carassius auratus", "shark"]
OBJECTNET_LINE_OF_LABEL = {"0": 2, "1": 4, "2": 0, "3": 1, "4": 5, "5": 3}
# folder -> (ObjectNet class, the ImageNet names it covers or None for a class outside ImageNet)
OBJECTNET_FOLDERS = {
    "white_shark": ("Great white", "great white shark, white shark"),
    "fish": ("Fish", "tench, Tinca tinca; goldfish, Carassius auratus"),
    "alarm_clock": ("Alarm clock", None),
    "shark": ("Shark", "shark"),
}
# label -> ImageNet labels, for the mapped folders in sorted order (fish, shark, white_shark)
OBJECTNET_IMAGENET_LABELS = [[0, 1], [3, 4], [2]]


def framed_png(path, size=10, inside=(0, 0, 255), frame=(255, 0, 0)):
    """A size x size PNG: colour ``inside`` framed by a 1-pixel ``frame``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = Image.new("RGB", (size, size), frame)
    image.paste(Image.new("RGB", (size - 2, size - 2), inside), (1, 1))
    image.save(path, "PNG")
    return path


def write_objectnet(root):
    """objectnet/objectnet-1.0/{images,mappings} as released, and ImageNet's classnames.txt."""
    base = os.path.join(root, "objectnet")
    release = os.path.join(base, "objectnet-1.0")
    for folder in OBJECTNET_FOLDERS:
        for i in range(TEST_ONLY_PER_CLASS):
            framed_png(os.path.join(release, "images", folder, f"{folder[:3]}{i}9c2e.png"))
    mappings = os.path.join(release, "mappings")
    write_json(os.path.join(mappings, "folder_to_objectnet_label.json"),
               {folder: name for folder, (name, _) in OBJECTNET_FOLDERS.items()})
    write_json(os.path.join(mappings, "objectnet_to_imagenet_1k.json"),
               {name: imagenet for name, imagenet in OBJECTNET_FOLDERS.values() if imagenet})
    write_text(os.path.join(mappings, "imagenet_to_label_2012_v2"), OBJECTNET_IMAGENET_LINES)
    write_json(os.path.join(mappings, "pytorch_to_imagenet_2012_id.json"), OBJECTNET_LINE_OF_LABEL)
    write_classnames(os.path.join(base, "classnames.txt"), OBJECTNET_IMAGENET)
    mapped = sorted(folder for folder, (_, imagenet) in OBJECTNET_FOLDERS.items() if imagenet)
    n = TEST_ONLY_PER_CLASS * len(mapped)
    return Mini([OBJECTNET_FOLDERS[folder][0] for folder in mapped], (n, 0, n))


# YAML stem -> (registered name, writer)
WRITERS = {
    "imagenet": ("ImageNet", write_imagenet),
    "caltech101": ("Caltech101", write_caltech101),
    "oxford_pets": ("OxfordPets", write_oxford_pets),
    "stanford_cars": ("StanfordCars", write_stanford_cars),
    "oxford_flowers": ("OxfordFlowers", write_oxford_flowers),
    "food101": ("Food101", write_food101),
    "fgvc_aircraft": ("FGVCAircraft", write_fgvc_aircraft),
    "sun397": ("SUN397", write_sun397),
    "dtd": ("DescribableTextures", write_dtd),
    "eurosat": ("EuroSAT", write_eurosat),
    "ucf101": ("UCF101", write_ucf101),
    "imagenetv2": ("ImageNetV2", write_imagenetv2),
    "imagenet_sketch": ("ImageNetSketch", write_imagenet_sketch),
    "imagenet_a": ("ImageNetA", write_imagenet_a),
    "imagenet_r": ("ImageNetR", write_imagenet_r),
    "objectnet": ("ObjectNet", write_objectnet),
}
