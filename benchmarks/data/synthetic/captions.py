"""Image-caption pairs of the synthetic world, for pretraining the tiny CLIP.

Captions describe an ``ImageAttributes`` row in varied words: synonyms, several sentence frames,
adjective or "with ..." patterns, and optional mentions of size, background and position, so
that partial descriptions ("a red triangle") are common. One frame is the zero-shot prompt of the
CIL suite ("a photo of a red striped triangle."), as web captions contain CLIP's prompt style.

Pretraining never shows the combinations in ``PRETRAIN_HELD_OUT``: part of the downstream CIL
classes, the way CLIP's web data did not name every CIFAR class. Every single colour, pattern and
shape still occurs in pretraining through other combinations, so a held-out class is reachable
only by composing attributes that were learnt apart.
"""

from __future__ import annotations

import numpy as np

from benchmarks.data.synthetic import world as S

# Word choices per attribute value; the first entry is the canonical word (the one in class
# names) and is drawn with probability _CANONICAL_P, the others share the rest.
COLOUR_WORDS: tuple[tuple[str, ...], ...] = (
    ("red", "crimson", "scarlet"),
    ("orange", "tangerine"),
    ("yellow", "golden", "lemon"),
    ("green", "grass-green"),
    ("teal", "turquoise", "cyan"),
    ("blue", "azure", "royal blue"),
    ("purple", "violet", "lilac"),
    ("pink", "rose", "rosy"),
    ("brown", "chocolate", "tan"),
    ("white", "snowy", "ivory"),
)
PATTERN_WORDS: tuple[tuple[str, ...], ...] = (  # adjectives
    ("solid", "plain", "single-coloured", "unpatterned"),
    ("striped", "stripy", "stripey"),
    ("dotted", "spotted", "polka-dot"),
    ("checkered", "chequered", "checked", "checkerboard"),
)
PATTERN_PHRASES: tuple[tuple[str, ...], ...] = (  # "a red triangle {phrase}"
    ("with no pattern", "in a single colour", "without any pattern"),
    ("with stripes", "with diagonal stripes", "covered in stripes"),
    ("with dots", "with spots", "covered in dots"),
    ("with a checkerboard pattern", "with checks", "in a chequered pattern"),
)
SHAPE_WORDS: tuple[tuple[str, ...], ...] = (
    ("circle", "disc", "disk"),
    ("square", "box"),
    ("triangle", "triangular shape"),
    ("diamond", "rhombus", "lozenge"),
    ("cross", "plus sign", "plus shape"),
    ("ring", "hoop", "annulus"),
)
SIZE_WORDS: tuple[tuple[str, ...], ...] = (
    ("small", "tiny", "little"),
    ("medium", "medium-sized", "mid-sized"),
    ("large", "big", "huge"),
)
BACKGROUND_PHRASES: tuple[tuple[str, ...], ...] = (
    ("on a dark background", "against a black backdrop", "on a dark grey background"),
    ("on a light background", "on a pale background", "against a bright backdrop"),
    ("on a tinted background", "on a coloured background", "against a muted backdrop"),
)
# Joins the distractor to the object: "a red triangle next to a blue circle".
DISTRACTOR_LINKS: tuple[str, ...] = ("next to", "and", "beside", "alongside")
# "{frame}" receives a noun phrase with its article, e.g. "a small red triangle on a dark background".
FRAMES: tuple[str, ...] = (
    "a photo of {}.",
    "an image of {}",
    "a picture of {}.",
    "{}",
    "{}.",
    "there is {} in this picture",
    "a drawing of {}",
    "a close-up photo of {}.",
    "an icon showing {}",
)

# The CIL suite's zero-shot prompt (strategies' prompt_template), verbatim, article included.
ZERO_SHOT_PROMPT = "a photo of a {}."

_CANONICAL_P = 0.6
_P_PROMPT = 0.15  # captions that are exactly the zero-shot prompt of their class
_P_COLOUR = 0.9
_P_PATTERN = 0.75
_P_PATTERN_PHRASE = 0.35  # given the pattern is mentioned: "with stripes" instead of "striped"
_P_PATTERN_FIRST = 0.3  # given both adjectives: "striped red" instead of "red striped"
_P_SIZE = 0.4
_P_BACKGROUND = 0.35
_P_POSITION = 0.15
_P_DISTRACTOR_MENTION = 0.5  # given a distractor: "... next to a blue circle"
_N_DRAWS = 16  # uniform draws per caption, consumed in a fixed order

# Fraction of the downstream classes whose combination pretraining never shows.
HELD_OUT_FRACTION = 0.5
_HELD_OUT_SEED = 1
_PRETRAIN_STREAM = 0x0C1F  # mixed into pretraining seeds: streams apart from the CIL splits'


def _held_out_classes() -> tuple[int, ...]:
    cil = S.default_class_ids()
    order = np.random.RandomState(_HELD_OUT_SEED).permutation(len(cil))
    return tuple(sorted(cil[i] for i in order[: round(HELD_OUT_FRACTION * len(cil))]))


PRETRAIN_HELD_OUT: tuple[int, ...] = _held_out_classes()
PRETRAIN_CLASS_IDS: tuple[int, ...] = tuple(sorted(set(range(S.N_CLASSES)) - set(PRETRAIN_HELD_OUT)))


def _pick(options: tuple[str, ...], u: float) -> str:
    """The canonical word with probability _CANONICAL_P, else one of the others, from a uniform draw."""
    if u < _CANONICAL_P or len(options) == 1:
        return options[0]
    rest = (u - _CANONICAL_P) / (1.0 - _CANONICAL_P)
    return options[1 + min(int(rest * (len(options) - 1)), len(options) - 2)]


def _choice(options: tuple[str, ...], u: float) -> str:
    return options[min(int(u * len(options)), len(options) - 1)]


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _position_phrase(dx: int, dy: int) -> str:
    """Where the object sits; offsets are small, so only clear ones are named (dy > 0 is down)."""
    vertical = "top" if dy <= -2 else "bottom" if dy >= 2 else ""
    horizontal = "left" if dx <= -2 else "right" if dx >= 2 else ""
    if not vertical and not horizontal:
        return "in the middle"
    return f"near the {' '.join(w for w in (vertical, horizontal) if w)}"


def caption(attributes: S.ImageAttributes, row: int, u: np.ndarray) -> str:
    """Caption of image ``row`` from ``_N_DRAWS`` uniform draws ``u`` (a pure function of both)."""
    colour, pattern, shape = (int(x[row]) for x in (attributes.colour, attributes.pattern, attributes.shape))
    if u[0] < _P_PROMPT:
        return ZERO_SHOT_PROMPT.format(S.class_name(int(attributes.class_id[row])))

    adjectives: list[str] = []
    if u[1] < _P_SIZE:
        adjectives.append(_pick(SIZE_WORDS[int(attributes.size[row])], u[2]))
    colour_word = _pick(COLOUR_WORDS[colour], u[4]) if u[3] < _P_COLOUR else None
    pattern_word = pattern_phrase = None
    if u[5] < _P_PATTERN:
        if u[6] < _P_PATTERN_PHRASE:
            pattern_phrase = _choice(PATTERN_PHRASES[pattern], u[7])
        else:
            pattern_word = _pick(PATTERN_WORDS[pattern], u[7])
    pair = [w for w in (colour_word, pattern_word) if w]
    adjectives += pair[::-1] if u[8] < _P_PATTERN_FIRST else pair

    words = [*adjectives, _pick(SHAPE_WORDS[shape], u[9])]
    if pattern_phrase:
        words.append(pattern_phrase)
    if u[10] < _P_BACKGROUND:
        words.append(_choice(BACKGROUND_PHRASES[int(attributes.background[row])], u[11]))
    if u[12] < _P_POSITION:
        words.append(_position_phrase(int(attributes.dx[row]), int(attributes.dy[row])))
    if attributes.distractor[row] and u[14] < _P_DISTRACTOR_MENTION:
        other = (
            f"{COLOUR_WORDS[int(attributes.distractor_colour[row])][0]} "
            f"{SHAPE_WORDS[int(attributes.distractor_shape[row])][0]}"
        )
        words.append(f"{_choice(DISTRACTOR_LINKS, u[15])} {_with_article(other)}")
    return _choice(FRAMES, u[13]).format(_with_article(" ".join(words)))


def captions(attributes: S.ImageAttributes, rng: np.random.Generator) -> list[str]:
    """One caption per image of ``attributes``; the same table and generator state give the same captions."""
    draws = rng.random((len(attributes), _N_DRAWS))
    return [caption(attributes, row, draws[row]) for row in range(len(attributes))]


def pretraining_rng(seed: int) -> np.random.Generator:
    """The generator of pretraining batches for ``seed``, on a stream of its own."""
    return np.random.default_rng([_PRETRAIN_STREAM, seed])


def sample_pretraining_pairs(
    n: int, rng: np.random.Generator
) -> tuple[S.ImageAttributes, np.ndarray, list[str]]:
    """``n`` fresh pairs over ``PRETRAIN_CLASS_IDS``: attributes, ``uint8`` images ``(n, 32, 32, 3)``,
    captions."""
    # Classes without replacement (a fresh permutation per pass): up to the class count, a batch
    # never shows one combination twice, so few in-batch negatives are really positives.
    passes = -(-n // len(PRETRAIN_CLASS_IDS))
    class_ids = np.concatenate([rng.permutation(PRETRAIN_CLASS_IDS) for _ in range(passes)])[:n]
    attributes = S.sample_attributes(class_ids, rng)
    return attributes, S.render(attributes), captions(attributes, rng)
