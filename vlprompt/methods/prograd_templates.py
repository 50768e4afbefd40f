"""ProGrad's sentence template of each dataset (the class name last; upstream's table).

ProGrad (``trainers/prograd.py``) initialises its context and builds its zero-shot teacher from it;
ProVP (``trainers/provp.py``) writes its sentences with it, as its upstream copied the table. Each
reads it through a DatasetRule of its own (a dataset outside the table takes its own template).
"""

__all__ = ["PROGRAD_TEMPLATES"]

PROGRAD_TEMPLATES = {
    "OxfordPets": "a type of pet, a photo of a {}.",
    "OxfordFlowers": "a type of flower, a photo of a {}.",
    "FGVCAircraft": "a type of aircraft, a photo of a {}.",
    "DescribableTextures": "a texture of {}.",
    "EuroSAT": "a centered satellite photo of {}.",
    "StanfordCars": "a photo of a {}.",
    "Food101": "a type of food, a photo of {}.",
    "SUN397": "a photo of a {}.",
    "Caltech101": "a photo of a {}.",
    "UCF101": "a photo of a person doing {}.",
    "ImageNet": "a photo of a {}.",
    "ImageNetSketch": "a photo of a {}.",
    "ImageNetV2": "a photo of a {}.",
    "ImageNetA": "a photo of a {}.",
    "ImageNetR": "a photo of a {}.",
}
