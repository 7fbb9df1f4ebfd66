"""The miniature's world: a deterministic offline image-classification world.

Each 32x32 RGB image shows one object. Its class is a (colour, pattern, shape) combination with a
readable name such as "red striped triangle"; size, position, background, colour jitter, pattern
phase, pixel noise and a distractor (a small second object in a corner, in ``P_DISTRACTOR`` of the
images) are nuisance factors drawn per image. Generation has three steps, kept
apart so that captions can later be written from the same table:

1. ``sample_attributes(class_ids, rng)`` draws an ``ImageAttributes`` table (int arrays);
2. ``render(attributes)`` turns the table into a ``uint8`` batch ``(N, 32, 32, 3)``;
3. ``class_name(class_id)`` and the ``*_NAMES`` vocabularies give the readable words.

Rendering is a pure function of the table (pixel noise comes from a per-image seed), so an
image looks the same whether it is rendered alone or in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from benchmarks.core.errors import UserError
from benchmarks.data.synthetic.domains import DEFAULT_DOMAIN, apply_domain

IMAGE_SIZE = 32

COLOUR_NAMES: tuple[str, ...] = (
    "red", "orange", "yellow", "green", "teal", "blue", "purple", "pink", "brown", "white",
)  # fmt: skip
_COLOUR_RGB = np.array(
    [
        (215, 35, 35),
        (240, 130, 20),
        (240, 215, 30),
        (40, 170, 50),
        (20, 170, 170),
        (35, 75, 215),
        (130, 45, 190),
        (240, 110, 180),
        (130, 75, 30),
        (235, 235, 235),
    ],
    dtype=np.int16,
)
# Hue in degrees, used to keep tinted backgrounds away from the object's hue; white has none.
_COLOUR_HUE = np.array([0, 30, 55, 125, 180, 225, 275, 330, 25, -1], dtype=np.int16)
_WHITE = COLOUR_NAMES.index("white")

PATTERN_NAMES: tuple[str, ...] = ("solid", "striped", "dotted", "checkered")
SHAPE_NAMES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "cross", "ring")
SIZE_NAMES: tuple[str, ...] = ("small", "medium", "large")
BACKGROUND_NAMES: tuple[str, ...] = ("dark", "light", "tinted")

N_CLASSES = len(COLOUR_NAMES) * len(PATTERN_NAMES) * len(SHAPE_NAMES)
DEFAULT_N_CLASSES = 100

_SIZE_RADIUS = np.array([6.5, 9.0, 11.5], dtype=np.float32)
_MAX_SHIFT = 3  # pixels; keeps even a large object inside the frame
_NOISE_AMPLITUDE = 10.0  # uint8 levels
P_DISTRACTOR = 0.6  # images with a second object, drawn over the first where they overlap
_DISTRACTOR_RADIUS = 4.5
_DISTRACTOR_INSET = 5.5  # pixels from the frame's edges to the distractor's centre
_SUBSET_SEED = 0  # picks the default class subset; checked to cover every attribute value
_RENDER_CHUNK = 2048  # images per vectorised block, bounds peak memory


@dataclass(frozen=True)
class ImageAttributes:
    """Per-image attributes of a batch; every field is an array whose first axis is the image."""

    class_id: np.ndarray  # global class id in [0, N_CLASSES)
    colour: np.ndarray  # index into COLOUR_NAMES
    pattern: np.ndarray  # index into PATTERN_NAMES
    shape: np.ndarray  # index into SHAPE_NAMES
    size: np.ndarray  # index into SIZE_NAMES
    dx: np.ndarray  # horizontal offset of the object centre, pixels
    dy: np.ndarray  # vertical offset of the object centre, pixels
    background: np.ndarray  # index into BACKGROUND_NAMES
    background_rgb: np.ndarray  # (N, 3) background colour
    colour_jitter: np.ndarray  # (N, 3) offset added to the object colour
    pattern_phase: np.ndarray  # (N, 2) pattern offset, pixels
    noise_seed: np.ndarray  # seed of the per-pixel noise
    distractor: np.ndarray  # bool: a second, small object in a corner
    distractor_colour: np.ndarray  # index into COLOUR_NAMES
    distractor_shape: np.ndarray  # index into SHAPE_NAMES
    distractor_corner: np.ndarray  # 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right

    def __len__(self) -> int:
        return len(self.class_id)

    def subset(self, index: np.ndarray | slice) -> ImageAttributes:
        """Rows ``index`` of the table."""
        return ImageAttributes(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def decode_class(class_id: int) -> tuple[int, int, int]:
    """Return the (colour, pattern, shape) indices of a global class id."""
    if not 0 <= class_id < N_CLASSES:
        raise ValueError(f"class id {class_id} outside [0, {N_CLASSES})")
    colour_pattern, shape = divmod(int(class_id), len(SHAPE_NAMES))
    colour, pattern = divmod(colour_pattern, len(PATTERN_NAMES))
    return colour, pattern, shape


def encode_class(colour: int, pattern: int, shape: int) -> int:
    """Inverse of ``decode_class``."""
    return (colour * len(PATTERN_NAMES) + pattern) * len(SHAPE_NAMES) + shape


def class_name(class_id: int) -> str:
    """Readable name of a global class id, e.g. ``"red striped triangle"``."""
    colour, pattern, shape = decode_class(class_id)
    return f"{COLOUR_NAMES[colour]} {PATTERN_NAMES[pattern]} {SHAPE_NAMES[shape]}"


def default_class_ids(n_classes: int = DEFAULT_N_CLASSES) -> list[int]:
    """The global class ids of an ``n_classes`` dataset: a fixed pseudo-random subset, in label order."""
    if not 1 <= n_classes <= N_CLASSES:
        raise UserError(f"the synthetic dataset has 1 to {N_CLASSES} classes; got n_classes={n_classes}")
    order = np.random.RandomState(_SUBSET_SEED).permutation(N_CLASSES)
    return [int(c) for c in order[:n_classes]]


def sample_attributes(class_ids: np.ndarray | list[int], rng: np.random.Generator) -> ImageAttributes:
    """Draw the nuisance factors of one image per entry of ``class_ids`` (global ids)."""
    class_id = np.asarray(class_ids, dtype=np.int64)
    n = len(class_id)
    colour_pattern, shape = np.divmod(class_id, len(SHAPE_NAMES))
    colour, pattern = np.divmod(colour_pattern, len(PATTERN_NAMES))

    size = rng.integers(0, len(SIZE_NAMES), n)
    dx = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, n)
    dy = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, n)

    # A white object on a light background would vanish: draw dark or tinted for it instead.
    background = rng.integers(0, len(BACKGROUND_NAMES), n)
    is_white = colour == _WHITE
    background[is_white & (background == 1)] = rng.choice([0, 2], int(np.sum(is_white & (background == 1))))
    background_rgb = _sample_background_rgb(background, colour, rng)

    return ImageAttributes(
        class_id=class_id,
        colour=colour,
        pattern=pattern,
        shape=shape,
        size=size,
        dx=dx,
        dy=dy,
        background=background,
        background_rgb=background_rgb,
        colour_jitter=rng.integers(-15, 16, (n, 3)).astype(np.int16),
        pattern_phase=rng.integers(0, 6, (n, 2)),
        noise_seed=rng.integers(0, 2**32, n, dtype=np.uint32),
        distractor=rng.random(n) < P_DISTRACTOR,
        distractor_colour=rng.integers(0, len(COLOUR_NAMES), n),
        distractor_shape=rng.integers(0, len(SHAPE_NAMES), n),
        distractor_corner=rng.integers(0, 4, n),
    )


def _sample_background_rgb(
    background: np.ndarray, colour: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Background colours: dark or light greys with a faint tint, or a muted far-away hue."""
    n = len(background)
    grey = np.where(background == 0, rng.integers(15, 61, n), rng.integers(185, 236, n))
    rgb = grey[:, None] + rng.integers(-8, 9, (n, 3))

    # Tinted: a hue at least 110 degrees from the object's (any hue for white), low saturation.
    object_hue = _COLOUR_HUE[colour].astype(np.float64)
    hue = np.where(object_hue < 0, rng.uniform(0, 360, n), object_hue + 180 + rng.uniform(-70, 70, n))
    tinted = _hsv_to_rgb(hue % 360, rng.uniform(0.3, 0.55, n), rng.uniform(0.35, 0.65, n))
    rgb = np.where((background == 2)[:, None], tinted, rgb)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _hsv_to_rgb(hue: np.ndarray, saturation: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Vectorised HSV (hue in degrees, s and v in [0, 1]) to RGB in [0, 255]."""
    k = (np.array([5.0, 3.0, 1.0])[None, :] + hue[:, None] / 60.0) % 6
    ramp = np.clip(np.minimum(k, 4 - k), 0, 1)
    return 255.0 * value[:, None] * (1 - saturation[:, None] * ramp)


def render(attributes: ImageAttributes) -> np.ndarray:
    """Render a batch of images, ``uint8`` of shape ``(N, 32, 32, 3)``."""
    out = np.empty((len(attributes), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for start in range(0, len(attributes), _RENDER_CHUNK):
        chunk = slice(start, start + _RENDER_CHUNK)
        out[chunk] = _render_chunk(attributes.subset(chunk))
    return out


def _render_chunk(a: ImageAttributes) -> np.ndarray:
    pixels = np.arange(IMAGE_SIZE, dtype=np.float32)
    centre = IMAGE_SIZE / 2 - 0.5
    radius = _SIZE_RADIUS[a.size][:, None, None]
    u = (pixels[None, None, :] - centre - a.dx[:, None, None]) / radius
    v = (pixels[None, :, None] - centre - a.dy[:, None, None]) / radius
    u, v = np.broadcast_arrays(u, v)

    inside = _shape_masks(a.shape, u, v)

    primary_area = np.ones_like(inside)
    x = pixels.astype(np.int64)[None, None, :] + a.pattern_phase[:, 0, None, None]
    y = pixels.astype(np.int64)[None, :, None] + a.pattern_phase[:, 1, None, None]
    for pattern_index in range(1, len(PATTERN_NAMES)):
        rows = np.flatnonzero(a.pattern == pattern_index)
        if len(rows):
            primary_area[rows] = _pattern_mask(PATTERN_NAMES[pattern_index], x[rows], y[rows])

    primary = np.clip(_COLOUR_RGB[a.colour] + a.colour_jitter, 0, 255).astype(np.float32)
    secondary = _secondary_colour(primary)
    object_rgb = np.where(primary_area[..., None], primary[:, None, None, :], secondary[:, None, None, :])
    image = np.where(inside[..., None], object_rgb, a.background_rgb[:, None, None, :].astype(np.float32))
    image = _draw_distractors(image, a, pixels)
    image += _pixel_noise(a.noise_seed)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _draw_distractors(image: np.ndarray, a: ImageAttributes, pixels: np.ndarray) -> np.ndarray:
    """Paint each image's distractor, a solid small shape in its corner, over ``image`` (float RGB)."""
    rows = np.flatnonzero(a.distractor)
    if not len(rows):
        return image
    far = IMAGE_SIZE - 1 - _DISTRACTOR_INSET
    cx = np.where(a.distractor_corner[rows] % 2 == 1, far, _DISTRACTOR_INSET)
    cy = np.where(a.distractor_corner[rows] >= 2, far, _DISTRACTOR_INSET)
    u = (pixels[None, None, :] - cx[:, None, None]) / _DISTRACTOR_RADIUS
    v = (pixels[None, :, None] - cy[:, None, None]) / _DISTRACTOR_RADIUS
    u, v = np.broadcast_arrays(u, v)
    inside = _shape_masks(a.distractor_shape[rows], u, v)
    colour = _COLOUR_RGB[a.distractor_colour[rows]].astype(np.float32)
    image[rows] = np.where(inside[..., None], colour[:, None, None, :], image[rows])
    return image


def _shape_masks(shapes: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per image ``i``, the pixels inside shape ``SHAPE_NAMES[shapes[i]]`` at coordinates ``u[i], v[i]``."""
    inside = np.zeros(u.shape, dtype=bool)
    for shape_index in range(len(SHAPE_NAMES)):
        rows = np.flatnonzero(shapes == shape_index)
        if len(rows):
            inside[rows] = _shape_mask(SHAPE_NAMES[shape_index], u[rows], v[rows])
    return inside


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pixels inside ``shape`` given coordinates normalised by the object radius (v points down)."""
    if shape == "circle":
        return u * u + v * v <= 1.0
    if shape == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.82
    if shape == "triangle":
        # Apex at the top (v = -1), base at v = 0.75, half-width 1 at the base.
        return (v <= 0.75) & (np.abs(u) <= (v + 1.0) / 1.75)
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= 1.0
    if shape == "cross":
        au, av = np.abs(u), np.abs(v)
        return ((au <= 0.34) & (av <= 1.0)) | ((av <= 0.34) & (au <= 1.0))
    if shape == "ring":
        r2 = u * u + v * v
        return (r2 <= 1.0) & (r2 >= 0.5**2)
    raise ValueError(f"unknown shape {shape!r}")


def _pattern_mask(pattern: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where the object shows its primary colour; periods are in pixels so they stay visible."""
    if pattern == "striped":
        return ((x + y) // 3) % 2 == 0
    if pattern == "dotted":
        dot = ((x % 5) - 2) ** 2 + ((y % 5) - 2) ** 2 <= 1
        return ~dot
    if pattern == "checkered":
        return ((x // 3) + (y // 3)) % 2 == 0
    raise ValueError(f"unknown pattern {pattern!r}")


def _secondary_colour(primary: np.ndarray) -> np.ndarray:
    """Second colour of a pattern: a dark shade of light colours, a pale tint of dark ones."""
    luminance = primary @ np.array([0.299, 0.587, 0.114], dtype=np.float32) / 255.0
    dark_shade = 0.35 * primary
    pale_tint = 0.4 * primary + 0.6 * 255.0
    return np.where((luminance > 0.45)[:, None], dark_shade, pale_tint)


def _pixel_noise(seeds: np.ndarray) -> np.ndarray:
    """Uniform noise in +-_NOISE_AMPLITUDE from one small generator per image seed."""
    noise = np.empty((len(seeds), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    for row, seed in enumerate(seeds):
        # PCG64 built directly: about 2x cheaper than default_rng's SeedSequence set-up.
        noise[row] = np.random.Generator(np.random.PCG64(int(seed))).random(noise.shape[1:], dtype=np.float32)
    return (2.0 * noise - 1.0) * _NOISE_AMPLITUDE


class SyntheticDataset(Dataset):
    """Rendered images in memory; yields ``(PIL RGB image, label)`` with labels in ``[0, n_classes)``."""

    def __init__(self, images: np.ndarray, targets: list[int], attributes: ImageAttributes) -> None:
        if len(images) != len(targets):
            raise ValueError("images and targets differ in length")
        self.images = images
        self.targets = targets
        self.attributes = attributes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index]), self.targets[index]


def make_split(
    class_ids: list[int], n_per_class: int, rng: np.random.Generator, domain: str = DEFAULT_DOMAIN
) -> SyntheticDataset:
    """Render ``n_per_class`` images of each global class id in ``domain``; label ``k`` means
    ``class_ids[k]``."""
    labels = np.repeat(np.arange(len(class_ids)), n_per_class)
    attributes = sample_attributes(np.asarray(class_ids, dtype=np.int64)[labels], rng)
    return SyntheticDataset(apply_domain(render(attributes), domain), labels.tolist(), attributes)


def make_splits(
    n_train_per_class: int = 100,
    n_test_per_class: int = 20,
    seed: int = 0,
    n_classes: int = DEFAULT_N_CLASSES,
    domain: str = DEFAULT_DOMAIN,
) -> tuple[SyntheticDataset, SyntheticDataset, list[str]]:
    """Train and test splits of the synthetic dataset, rendered in ``domain``, and the class names.

    The same arguments give byte-identical images. The nuisance draws do not depend on the domain,
    so the "photo" and shifted versions of an image show the same object.
    """
    for name, value in (("n_train_per_class", n_train_per_class), ("n_test_per_class", n_test_per_class)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"the synthetic dataset needs {name} >= 1 (a whole number); got {value!r}")
    class_ids = default_class_ids(n_classes)
    # Separate child streams so train and test never share nuisance draws.
    train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    train = make_split(class_ids, n_train_per_class, train_rng, domain)
    test = make_split(class_ids, n_test_per_class, test_rng, domain)
    return train, test, [class_name(c) for c in class_ids]
