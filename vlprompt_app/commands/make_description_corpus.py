"""Write the generic image-description corpus of the head-role tool.

    python tools/make_description_corpus.py [--out vlprompt/interpret/data/generic_image_descriptions.tsv]

TEXTSPAN (Gandelsman et al., ICLR 2024) describes each attention head by a few sentences
picked from a fixed pool of short, generic image descriptions. This script builds that
pool for the project, combinatorially from the word lists below (written for it), so
the shipped file can be regenerated and checked byte for byte. Each line is
``concept<TAB>description``; the concept is the family the description was generated
for (the twelve concept families the DeAR paper reports: location, object, color, shape,
texture, animal, human, text, number, style, emotion, action). Every family is capped at
``PER_CONCEPT`` descriptions, drawn with a seeded RNG when the templates produce more.
"""
import argparse
import itertools
import random
import re

from vlprompt.fileio import write_text
from vlprompt.paths import repository_root

DEFAULT_OUT = str(repository_root() / "vlprompt" / "interpret" / "data" / "generic_image_descriptions.tsv")
PER_CONCEPT = 300
SEED = 2024

PLACES = (
    "Paris", "Tokyo", "Kyoto", "Cairo", "Lisbon", "Reykjavik", "Nairobi", "Havana", "Istanbul",
    "Venice", "Rio de Janeiro", "Bangkok", "Marrakesh", "Sydney", "Cape Town", "Buenos Aires",
    "Mumbai", "Hanoi", "Oslo", "Dublin", "Prague", "Mexico City", "Seoul", "Lima", "Vancouver",
    "New York", "San Francisco", "Chicago", "Berlin", "Barcelona", "Athens", "Edinburgh",
    "Iceland", "Patagonia", "Mongolia", "Nepal", "Bhutan", "Tuscany", "Provence", "Bali",
    "Alaska", "Sahara", "Scandinavia", "the Alps", "the Andes", "the Himalayas", "the Amazon",
    "the Outback", "Siberia", "Greenland", "Madagascar", "the Caribbean", "the Arctic",
    "Yellowstone", "the Scottish Highlands", "the Greek islands", "Norway", "Peru", "Morocco",
    "Vietnam",
)
PLACE_TEMPLATES = ("Photo taken in {}", "Picture taken in {}", "An image of {}", "A street in {}", "Landscape of {}")
SCENES = (
    "forest", "beach", "desert", "meadow", "canyon", "glacier", "harbor", "city street", "alleyway",
    "subway station", "airport terminal", "train platform", "market", "cafe", "library", "kitchen",
    "bedroom", "office", "classroom", "museum", "art gallery", "church", "temple", "castle",
    "farm", "vineyard", "rice field", "mountain lake", "waterfall", "river bank", "swamp",
    "coral reef", "cave", "volcano", "island", "countryside", "suburb", "parking lot", "stadium",
    "playground", "garden", "park", "rooftop", "bridge", "lighthouse", "harbor pier",
)
SCENE_ADJECTIVES = ("busy", "quiet", "snowy", "sunlit", "foggy", "abandoned", "crowded", "peaceful", "rainy", "remote")
SCENE_TEMPLATES = ("A {} {}", "Picture of a {} {}", "View of a {} {}")

OBJECTS = (
    "bottle", "cup", "mug", "bowl", "plate", "fork", "spoon", "knife", "chair", "table", "lamp",
    "clock", "phone", "laptop", "keyboard", "book", "bookmark", "pen", "pencil", "backpack",
    "handbag", "wallet", "umbrella", "hat", "bonnet", "jacket", "skirt", "sock", "shoe",
    "shoelace", "belt", "necklace", "ring box", "watch", "bicycle", "car", "bus", "truck",
    "boat", "airplane", "kite", "ball", "guitar", "violin", "drum", "megaphone", "camera",
    "television", "radio", "fan", "kettle", "teapot", "vase", "candle", "mirror", "pillow",
    "blanket", "rug", "shelf", "basket", "bucket", "ladder", "hammer", "screwdriver", "key",
    "lock", "door", "window", "bench", "mailbox", "traffic light", "stick", "rope", "tire",
    "helmet", "glove", "scarf", "suitcase", "toothbrush", "sofa",
)
OBJECT_TEMPLATES = ("A {}", "A photo of a {}", "An image with a {}", "A close-up of a {}")

COLORS = (
    "red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white",
    "gray", "teal", "turquoise", "navy blue", "crimson", "maroon", "olive green", "lime green",
    "gold", "silver", "beige", "lavender", "magenta", "cyan", "charcoal gray", "ivory", "coral",
    "emerald green", "scarlet", "amber",
)
COLOR_TEMPLATES = (
    "Image with a {} color", "A {} color", "Something colored {}", "A mostly {} picture",
    "An image with {} tones", "Bright {} hues",
)
PALETTES = (
    "Warm color tones", "Cold color tones", "Earthy color tones", "Pastel colors", "Neon colors",
    "Muted colors", "Vivid saturated colors", "Monochrome colors", "Pop art colors", "Sepia tones",
)

SHAPES = (
    "circle", "square", "triangle", "rectangle", "oval", "star", "heart", "diamond", "hexagon",
    "pentagon", "octagon", "heptagon", "crescent", "spiral", "cross", "arrow", "cube", "sphere",
    "cone", "cylinder", "pyramid", "ring", "zigzag", "wave", "arch",
)
SHAPE_ADJECTIVES = ("regular", "irregular", "large", "small", "round", "pointed")
SHAPE_TEMPLATES = ("A {} {}", "An image with a {} {} shape", "A {} {} silhouette")

MATERIALS = (
    "wood", "marble", "rubber", "fabric", "wool", "silk", "leather", "velvet", "denim", "stone",
    "brick", "concrete", "metal", "rust", "glass", "sand", "bark", "moss", "fur", "feathers",
    "scales", "paper", "cardboard", "ceramic", "lace", "straw", "wicker", "cork", "foam", "ice",
)
TEXTURE_TEMPLATES = (
    "Close-up of a textured {}", "Image with {} texture", "A rough {} surface", "A smooth {} surface",
    "The grain of {} up close", "A pattern made of {}",
)
PATTERNS = (
    "Herringbone pattern", "Polka dot pattern", "Checkered pattern", "Striped pattern",
    "Zebra stripe motifs", "Woven basket texture", "Delicate embroidery", "Knitted texture",
    "Marbleized design", "Honeycomb pattern", "Paisley pattern", "Crackled surface",
    "Grainy texture", "Bumpy surface", "Furry texture", "Mosaic tiles", "Fine mesh", "Rippled water surface",
)

ANIMALS = (
    "dog", "cat", "horse", "cow", "sheep", "goat", "pig", "rabbit", "hamster", "parrot", "owl",
    "eagle", "seagull", "pigeon", "duck", "swan", "penguin", "flamingo", "butterfly", "bee",
    "spider", "snail", "frog", "turtle", "lizard", "snake", "crocodile", "fish", "shark",
    "dolphin", "whale", "octopus", "crab", "lion", "tiger", "leopard", "cheetah", "elephant",
    "giraffe", "zebra", "monkey", "gorilla", "bear", "panda", "fox", "wolf", "deer", "squirrel",
    "kangaroo", "koala",
)
ANIMAL_TEMPLATES = ("A photo of a {}", "An image with a {}", "A wild {}", "A {} in its habitat", "A baby {}", "Picture with a {}")

PEOPLE = (
    "young person", "old man", "old woman", "child", "toddler", "teenager", "woman", "man",
    "baby", "couple", "family", "group of friends", "team of workers", "crowd", "chef",
    "doctor", "nurse", "firefighter", "police officer", "soldier", "farmer", "fashion designer",
    "musician", "dancer", "athlete", "student", "teacher", "businessman", "bride", "groom",
)
PEOPLE_TEMPLATES = ("A photo of a {}", "Portrait of a {}", "An image of a {}", "A smiling {}", "A candid shot of a {}")
PEOPLE_COUNTS = ("one person", "two people", "three people", "four people", "five people", "a large group of people")

LETTERS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
WORDS = (
    "STOP", "OPEN", "EXIT", "SALE", "HELLO", "LOVE", "HOTEL", "CAFE", "POLICE", "TAXI", "BANK",
    "PARKING", "DANGER", "WELCOME", "NEWS", "MENU", "FREE", "PUSH", "PULL", "SILENCE",
)
TEXT_TEMPLATES_LETTER = (
    "A photo with the letter {}", "An image of the letter {}", "The letter {} written in ink",
    "A sign with the letter {}",
)
TEXT_TEMPLATES_WORD = ("A sign that says {}", "An image with the word {}", "The word {} in bold letters")
TYPOGRAPHY = (
    "Bold graffiti", "Handwritten note", "Calligraphy writing", "Newspaper headline",
    "Street sign with text", "Neon sign lettering", "Morse code typography", "Typewritten page",
    "Book cover title", "Chalkboard writing", "Subtitle text", "License plate", "Poster with slogans",
)

NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty", "fifty", "one hundred",
)
NUMBER_TEMPLATES_DIGIT = ("An image of the number {}", "The digit {}", "A sign showing the number {}")
NUMBER_TEMPLATES_WORD = ("The number {}", "A picture of the number {}")
COUNTED = ("apples", "coins", "balloons", "candles", "chairs", "birds", "cars", "stars", "dots", "boxes")

STYLES = (
    "anime", "cartoon", "comic book", "watercolor", "oil painting", "pencil drawing",
    "charcoal sketch", "pixel art", "low poly", "cubist", "impressionist", "surrealist",
    "art deco", "art nouveau", "pop art", "minimalist", "baroque", "ukiyo-e", "vaporwave",
    "cyberpunk", "steampunk", "retro", "vintage", "film noir", "black and white", "infrared",
    "long exposure", "tilt-shift", "double exposure", "macro", "aerial", "fisheye",
    "high dynamic range", "polaroid", "stained glass", "mosaic", "graffiti", "abstract",
    "photorealistic", "3D rendered",
)
STYLE_TEMPLATES = ("A {} style image", "Artwork in {} style", "A {} picture", "A poster in {} style")
STYLE_PHRASES = (
    "Cinematic framing", "Dramatic chiaroscuro photography", "Retro-style poster design",
    "Stark minimalism", "Geometric tessellation", "Playful reflections", "Central focal point",
    "Motion freeze", "Dramatic skies", "Unexpected symmetry", "Soft bokeh background",
    "Harsh shadows", "Golden hour lighting", "Blurry snapshot", "A high-resolution image",
    "A low-resolution image", "Overexposed photograph", "Grainy film photograph",
)

EMOTIONS = (
    "happy", "sad", "angry", "surprised", "scared", "disgusted", "calm", "bored", "excited",
    "confused", "proud", "shy", "nervous", "joyful", "gloomy", "thoughtful", "sarcastic",
    "intrigued", "relieved", "lonely", "hopeful", "tired", "amused", "determined",
)
EMOTION_TEMPLATES = (
    "A {} facial expression", "A person looking {}", "A {} mood", "A {} face",
    "Someone feeling {}", "A {} atmosphere", "A {} smile", "Faces that look {}",
)

ACTIONS = (
    "running", "jumping", "swimming", "dancing", "singing", "cooking", "reading", "writing",
    "painting", "climbing", "cycling", "skiing", "surfing", "skateboarding", "playing football",
    "playing tennis", "playing the piano", "playing the guitar", "eating", "drinking coffee",
    "sleeping", "walking a dog", "hugging", "shaking hands", "waving", "laughing", "crying",
    "fishing", "gardening", "driving", "typing on a laptop", "taking a photo", "lifting weights",
    "doing yoga", "throwing a ball", "kicking a ball", "riding a horse", "boxing", "juggling",
    "sweeping the floor",
)
ACTION_TEMPLATES = ("A person {}", "People {}", "A child {}", "An athlete {}", "Someone {} outdoors")


def _fill(templates, *word_lists):
    """Every template filled with every combination of words ("a" before a vowel becomes "an")."""
    filled = (t.format(*words) for t in templates for words in itertools.product(*word_lists))
    return [re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", text) for text in filled]


def candidates():
    """Concept -> list of candidate descriptions (before capping), in a fixed order."""
    return {
        "location": _fill(PLACE_TEMPLATES, PLACES) + _fill(SCENE_TEMPLATES, SCENE_ADJECTIVES, SCENES),
        "object": _fill(OBJECT_TEMPLATES, OBJECTS),
        "color": _fill(COLOR_TEMPLATES, COLORS) + list(PALETTES),
        "shape": _fill(SHAPE_TEMPLATES, SHAPE_ADJECTIVES, SHAPES),
        "texture": _fill(TEXTURE_TEMPLATES, MATERIALS) + list(PATTERNS),
        "animal": _fill(ANIMAL_TEMPLATES, ANIMALS),
        "human": _fill(PEOPLE_TEMPLATES, PEOPLE) + _fill(("An image with {}", "A group photo of {}"), PEOPLE_COUNTS),
        "text": _fill(TEXT_TEMPLATES_LETTER, LETTERS) + _fill(TEXT_TEMPLATES_WORD, WORDS) + list(TYPOGRAPHY),
        "number": _fill(NUMBER_TEMPLATES_DIGIT, [str(n) for n in range(0, 101)])
        + _fill(NUMBER_TEMPLATES_WORD, NUMBER_WORDS)
        + _fill(("A picture of {} {}",), NUMBER_WORDS[2:13], COUNTED),
        "style": _fill(STYLE_TEMPLATES, STYLES) + list(STYLE_PHRASES),
        "emotion": _fill(EMOTION_TEMPLATES, EMOTIONS),
        "action": _fill(ACTION_TEMPLATES, ACTIONS),
    }


def build_corpus(per_concept=PER_CONCEPT, seed=SEED):
    """The corpus as a list of (concept, description), grouped by concept.

    Within a concept, descriptions keep the template order; when there are more than
    ``per_concept`` distinct candidates, a sample drawn with ``random.Random(seed)`` is kept.
    """
    rows = []
    for concept, texts in candidates().items():
        texts = list(dict.fromkeys(" ".join(t.split()) for t in texts))
        if len(texts) > per_concept:
            keep = set(random.Random(f"{seed}-{concept}").sample(range(len(texts)), per_concept))
            texts = [t for i, t in enumerate(texts) if i in keep]
        rows.extend((concept, text) for text in texts)
    return rows


def corpus_text(rows):
    return "".join(f"{concept}\t{text}\n" for concept, text in rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"file to write (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    rows = build_corpus()
    write_text(corpus_text(rows), args.out, newline="\n")
    counts = {}
    for concept, _ in rows:
        counts[concept] = counts.get(concept, 0) + 1
    print(f"Wrote {len(rows)} descriptions to {args.out}: " + ", ".join(f"{c} {n}" for c, n in counts.items()))


if __name__ == "__main__":
    main()
