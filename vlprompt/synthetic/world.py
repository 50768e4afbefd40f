"""The procedural world: one object on a background, drawn from named attributes.

A :class:`Scene` names the attributes of an image (shape, colour, texture, location,
size, background); :func:`render` draws it with NumPy on a 64x64 canvas and downsizes
it to 32x32 (box filter, so edges are anti-aliased). Everything random in a drawing
(exact hue, position jitter, rotation, stripe angle, background colours) comes from the
``numpy.random.Generator`` passed in, so a scene and a seed give the same pixels on
every machine.

A :class:`RenderStyle` says how scenes are drawn beyond their attributes: which
backgrounds and sizes occur, distractor objects, sketch-like outline drawing.
Pretraining uses :data:`PRETRAIN_STYLE`; the downstream sets use shifted styles (see
``vlprompt.synthetic.downstream``).
"""
from dataclasses import dataclass, replace
from typing import Tuple

import numpy as np
from PIL import Image

__all__ = [
    "SHAPES", "COLORS", "TEXTURES", "LOCATIONS", "SIZES", "BACKGROUNDS", "ATTRIBUTES",
    "Scene", "RenderStyle", "PRETRAIN_STYLE", "sample_scene", "render", "CANVAS", "IMAGE_SIZE",
]

CANVAS = 64  # drawing resolution (pixels)
IMAGE_SIZE = 32  # output resolution (pixels)

SHAPES = ("circle", "square", "triangle", "star", "hexagon", "cross", "diamond", "ring", "crescent", "heart")
# Colour name -> base RGB (each drawing jitters it).
COLORS = {
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (240, 215, 30),
    "green": (40, 165, 55),
    "blue": (35, 75, 215),
    "purple": (130, 45, 175),
    "pink": (250, 125, 190),
    "brown": (125, 80, 40),
}
TEXTURES = ("solid", "striped", "dotted", "checkered")
# Location name -> direction of the offset from the canvas centre (x right, y down).
LOCATIONS = {
    "center": (0, 0),
    "top left": (-1, -1),
    "top right": (1, -1),
    "bottom left": (-1, 1),
    "bottom right": (1, 1),
}
# Size name -> object radius range on the 64-pixel canvas. "tiny" and "huge" are never
# drawn in pretraining; downstream styles may use them as a shift.
SIZES = {"tiny": (6.5, 7.5), "small": (9.0, 11.0), "medium": (13.5, 15.5), "large": (19.0, 21.0), "huge": (24.0, 26.0)}
BACKGROUNDS = ("plain", "noise", "gradient", "clutter", "bright", "paper")
ATTRIBUTES = ("shape", "color", "texture", "location", "size", "background")


@dataclass(frozen=True)
class Scene:
    """The named attributes of one image (each a key of its vocabulary above)."""

    shape: str
    color: str
    texture: str
    location: str
    size: str
    background: str


@dataclass(frozen=True)
class RenderStyle:
    """How scenes are sampled and drawn beyond their named attributes.

    Attributes:
        sizes, backgrounds, textures, locations: vocabularies scenes are sampled from.
        color_jitter: max per-channel deviation from the base colour (0-255 scale).
        distractor_prob: probability of a second, small, grey object.
        outline: draw the object as a full-colour outline over a pale wash of its
            colour (sketch-like).
        wash: opacity of that wash inside an outline.
        rotation: max rotation of the object in degrees.
        jitter: max position jitter in canvas pixels.
    """

    sizes: Tuple[str, ...] = ("small", "medium", "large")
    backgrounds: Tuple[str, ...] = ("plain", "noise", "gradient", "clutter")
    textures: Tuple[str, ...] = TEXTURES
    locations: Tuple[str, ...] = tuple(LOCATIONS)
    color_jitter: float = 18.0
    distractor_prob: float = 0.0
    outline: bool = False
    wash: float = 0.5
    rotation: float = 12.0
    jitter: float = 3.0

    def evolve(self, **changes):
        """A copy with some fields changed."""
        return replace(self, **changes)


PRETRAIN_STYLE = RenderStyle()


def sample_scene(rng, style=PRETRAIN_STYLE, shape=None, color=None, texture=None):
    """Draw a Scene from ``style``'s vocabularies; given attributes are kept as they are."""

    def pick(options):
        return options[int(rng.integers(len(options)))]

    return Scene(
        shape=shape or pick(SHAPES),
        color=color or pick(tuple(COLORS)),
        texture=texture or pick(style.textures),
        location=pick(style.locations),
        size=pick(style.sizes),
        background=pick(style.backgrounds),
    )


# ----------------------------------------------------------------------------- shapes

def _shape_mask(shape, u, v):
    """Inside-mask of a unit-radius shape; u, v: [H, W] local coordinates (v down)."""
    r2 = u * u + v * v
    au, av = np.abs(u), np.abs(v)
    if shape == "circle":
        return r2 <= 1.0
    if shape == "ring":
        return (r2 <= 1.0) & (r2 >= 0.55 ** 2)
    if shape == "square":
        return np.maximum(au, av) <= 0.82
    if shape == "diamond":
        return au + av <= 1.0
    if shape == "triangle":
        return (v <= 0.55) & (np.sqrt(3.0) * au <= v + 1.05)
    if shape == "hexagon":
        return np.maximum(av / 0.866, au + av / np.sqrt(3.0)) <= 1.0
    if shape == "cross":
        return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))
    if shape == "star":
        theta = np.arctan2(u, -v)  # 0 points up
        wave = np.abs(((theta * 5.0 / (2.0 * np.pi)) % 1.0) - 0.5) * 2.0  # 1 at the tips
        return np.sqrt(r2) <= 0.42 + 0.58 * wave ** 1.5
    if shape == "crescent":
        return (r2 <= 1.0) & ((u - 0.45) ** 2 + (v + 0.1) ** 2 > 0.8 ** 2)
    if shape == "heart":
        x, y = u * 1.25, -v * 1.25 + 0.2
        return (x * x + y * y - 1.0) ** 3 - x * x * y ** 3 <= 0.0
    raise ValueError(f"Unknown shape '{shape}'; expected one of {SHAPES}.")


def _outline(mask):
    """The border pixels of a boolean mask (about two pixels wide on the canvas)."""
    inner = mask.copy()
    for axis in (0, 1):
        for shift in (-2, -1, 1, 2):
            inner &= np.roll(mask, shift, axis=axis)
    return mask & ~inner


# Shade of a texture's dark tone, and of a solid object (the mean shade of a patterned one:
# every pattern darkens half of the object's pixels), so an object's mean colour says
# nothing about its texture and texture can only be read from the pattern.
DARK_SHADE = 0.38
SOLID_SHADE = (1.0 + DARK_SHADE) / 2
# Patterns are printed on a lattice fixed to the image, one cell per 8x8-pixel patch of the
# tiny CLIP (16 canvas pixels): every patch an object covers holds the same piece of its
# pattern wherever the object lies, so a patch's pattern is a fixed template.
TEXTURE_CELL = 16.0


_TEXTURE_MASKS = {}  # texture -> its read-only mask on the canvas grid (the same for every drawing)


def _canvas_texture_mask(texture):
    """``_texture_mask`` of ``texture`` on the canvas grid, computed once per texture."""
    mask = _TEXTURE_MASKS.get(texture)
    if mask is None:
        y, x = _GRID
        mask = _texture_mask(texture, x, y)
        mask.setflags(write=False)
        _TEXTURE_MASKS[texture] = mask
    return mask


def _texture_mask(texture, x, y):
    """Pixels of the object drawn in the texture's dark tone (half of each lattice cell for every pattern).

    Args:
        texture: one of TEXTURES.
        x, y: canvas pixel-centre coordinates [H, W].

    Returns:
        [H, W] bool.
    """
    if texture == "solid":
        return np.zeros(x.shape, dtype=bool)
    u = (x % TEXTURE_CELL) / TEXTURE_CELL  # position inside the cell, in [0, 1)
    v = (y % TEXTURE_CELL) / TEXTURE_CELL
    if texture == "striped":  # horizontal stripes, two per cell
        return (2.0 * v) % 1.0 < 0.5
    if texture == "dotted":  # one dot per cell, covering half of it
        return (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 1.0 / (2.0 * np.pi)
    if texture == "checkered":  # 2 x 2 checks per cell
        return (np.floor(2.0 * u) + np.floor(2.0 * v)) % 2 == 1
    raise ValueError(f"Unknown texture '{texture}'; expected one of {TEXTURES}.")


# ----------------------------------------------------------------------------- backgrounds

def _background(kind, x, y, rng):
    """Background image [H, W, 3] (float, 0-255) of the given kind."""
    size = x.shape[0]
    if kind == "plain":
        grey = rng.uniform(40, 215)
        return np.broadcast_to(grey + rng.uniform(-25, 25, size=3), (size, size, 3)).astype(np.float32)
    if kind == "noise":
        base = rng.uniform(70, 185) + rng.uniform(-20, 20, size=3)
        return base + rng.normal(0.0, rng.uniform(25, 45), size=(size, size, 3))
    if kind == "gradient":
        start, stop = rng.uniform(30, 225, size=(2, 3))
        angle = rng.uniform(0.0, 2.0 * np.pi)
        t = ((x - size / 2) * np.cos(angle) + (y - size / 2) * np.sin(angle)) / size + 0.5
        t = np.clip(t, 0.0, 1.0)[..., None]
        return start * (1.0 - t) + stop * t
    if kind == "clutter":
        image = np.empty((size, size, 3), dtype=np.float32)
        image[:] = rng.uniform(60, 190) + rng.uniform(-15, 15, size=3)
        for _ in range(int(rng.integers(8, 15))):
            x0, y0 = rng.integers(0, size, size=2)
            w, h = rng.integers(2, 9, size=2)
            image[y0 : y0 + h, x0 : x0 + w] = rng.uniform(20, 235, size=3)
        return image
    if kind == "bright":  # pale pastel plain backgrounds (a downstream shift)
        return np.broadcast_to(rng.uniform(215, 250, size=3), (size, size, 3)).astype(np.float32)
    if kind == "paper":  # near-white with faint grain (sketch variant)
        return rng.uniform(232, 250) + rng.normal(0.0, 4.0, size=(size, size, 1)).repeat(3, axis=2)
    raise ValueError(f"Unknown background '{kind}'; expected one of {BACKGROUNDS}.")


# ----------------------------------------------------------------------------- drawing

_GRID = np.mgrid[0:CANVAS, 0:CANVAS].astype(np.float32) + 0.5  # [2 (y, x), H, W]


def _object_layout(scene, style, rng):
    """Centre (cx, cy), radius and rotation (radians) of the object on the canvas."""
    low, high = SIZES[scene.size]
    radius = rng.uniform(low, high)
    dx, dy = LOCATIONS[scene.location]
    reach = max(CANVAS / 2 - radius - 3.0, 0.0) * 0.85
    cx = CANVAS / 2 + dx * reach + rng.uniform(-style.jitter, style.jitter)
    cy = CANVAS / 2 + dy * reach + rng.uniform(-style.jitter, style.jitter)
    angle = np.deg2rad(rng.uniform(-style.rotation, style.rotation))
    return cx, cy, radius, angle


def _local_coords(cx, cy, radius, angle):
    y, x = _GRID
    dx, dy = x - cx, y - cy
    cos, sin = np.cos(angle), np.sin(angle)
    return (cos * dx + sin * dy) / radius, (-sin * dx + cos * dy) / radius


def render(scene, rng, style=PRETRAIN_STYLE):
    """Draw ``scene``.

    Args:
        scene: Scene.
        rng: numpy Generator (all randomness of the drawing comes from it).
        style: RenderStyle.

    Returns:
        PIL RGB image of IMAGE_SIZE x IMAGE_SIZE pixels.
    """
    y, x = _GRID
    image = np.array(_background(scene.background, x, y, rng), dtype=np.float32)

    if rng.random() < style.distractor_prob:
        cx, cy = rng.uniform(8, CANVAS - 8, size=2)
        u, v = _local_coords(cx, cy, rng.uniform(5.0, 7.0), 0.0)
        image[_shape_mask(SHAPES[int(rng.integers(len(SHAPES)))], u, v)] = rng.uniform(90, 170)

    cx, cy, radius, angle = _object_layout(scene, style, rng)
    u, v = _local_coords(cx, cy, radius, angle)
    mask = _shape_mask(scene.shape, u, v)
    color = np.clip(np.array(COLORS[scene.color], dtype=np.float32)
                    + rng.uniform(-style.color_jitter, style.color_jitter, size=3), 0, 255)
    if style.outline:
        border = _outline(mask)
        inside = mask & ~border
        image[inside] = (1.0 - style.wash) * image[inside] + style.wash * color
        mask = border
    dark = _canvas_texture_mask(scene.texture) & mask
    image[mask] = color * SOLID_SHADE if scene.texture == "solid" else color
    image[dark] = color * DARK_SHADE

    factor = CANVAS // IMAGE_SIZE
    small = image.reshape(IMAGE_SIZE, factor, IMAGE_SIZE, factor, 3).sum(axis=(1, 3)) / (factor * factor)
    return Image.fromarray(np.clip(small + 0.5, 0, 255).astype(np.uint8))
