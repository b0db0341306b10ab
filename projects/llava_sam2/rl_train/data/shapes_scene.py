"""Shapes world, part 1: scene sampling, exact object masks and the caption grammar.

A scene holds 1-4 objects, each with a ``shape``, a ``colour``, a ``size`` (small/big) and a
position ``cell`` (3x3 grid of the image, from the centroid of the visible pixels). Objects are
painted in order, so a later object may hide part of an earlier one; an object's mask is its
visible part. Sampling guarantees:

* every object is at least ``MIN_VISIBLE`` visible, so its shape stays recognisable;
* no two objects share (size, colour, shape, cell): the canonical caption names exactly one object;
* with 2+ objects, the first distractor shares the target's colour or its shape (never both), so
  a caption must get its attributes right to pick the target.

The video world (``shapes_video.py``) draws its clips with the same sampler and a moving layout
(``sample_scene(place=...)``), the same objects (``draw_object``), occlusion (``occlude``) and referent rule
(``matching_objects``), so both worlds share one vocabulary and one text generator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import PIL.Image
import PIL.ImageDraw

SHAPES = ("circle", "square", "triangle", "star", "cross")
COLOURS = {  # name -> base RGB; every pair differs by >= 70 in some channel
    "red": (200, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 200),
    "yellow": (220, 200, 40), "purple": (150, 50, 180), "orange": (235, 130, 30),
}
SIZES = {"small": (0.07, 0.10), "big": (0.14, 0.19)}  # radius range, fraction of the image side
CELL_PHRASES = {  # (row, col) of the 3x3 grid -> (cell name, position phrase)
    (0, 0): ("top left", "in the top left"), (0, 1): ("top", "at the top"),
    (0, 2): ("top right", "in the top right"), (1, 0): ("left", "on the left"),
    (1, 1): ("center", "in the center"), (1, 2): ("right", "on the right"),
    (2, 0): ("bottom left", "in the bottom left"), (2, 1): ("bottom", "at the bottom"),
    (2, 2): ("bottom right", "in the bottom right"),
}
MIN_VISIBLE = 0.6      # visible fraction of every object's full shape
COLOUR_JITTER = 15     # per-channel offset of an object's fill from its base colour
ATTRIBUTES = ("size", "colour", "shape", "cell")
# attribute subsets tried (in order) for short referring expressions; the full set always identifies
_SHORT_SETS = (("shape",), ("colour", "shape"), ("size", "shape"), ("shape", "cell"),
               ("size", "colour", "shape"), ("colour", "shape", "cell"), ("size", "shape", "cell"))
_TEMPLATE_WORDS = "a the that is whose colour"
VOCABULARY = tuple(sorted(set(
    _TEMPLATE_WORDS.split() + list(SHAPES) + list(COLOURS) + list(SIZES)
    + [w for _, phrase in CELL_PHRASES.values() for w in phrase.split()])))


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    colour: str
    size: str
    centre: tuple[float, float]  # (x, y) pixels
    radius: float                # pixels
    angle: float                 # radians
    fill: tuple[int, int, int]   # RGB painted (before per-pixel noise)


@dataclass
class Scene:
    """Objects in paint order, their visible masks ``[n, H, W]`` and the target's index."""

    objects: list[ShapeObject]
    visible: np.ndarray
    target: int
    attrs: list[dict[str, str]] = field(init=False)

    def __post_init__(self):
        self.attrs = [object_attributes(obj, cell_of(visible)) for obj, visible in zip(self.objects, self.visible)]

    def referents(self, attrs: dict[str, str]) -> list[int]:
        """Indices of the objects that ``attrs`` (any subset of ATTRIBUTES) describes."""
        return matching_objects(self.attrs, [{own["cell"]} for own in self.attrs], attrs)


def cell_of(visible: np.ndarray) -> str:
    """Name of the 3x3 grid cell holding the centroid of a non-empty bool ``[side, side]`` mask."""
    side = visible.shape[0]
    ys, xs = np.nonzero(visible)
    return CELL_PHRASES[(min(int(ys.mean() * 3 / side), 2), min(int(xs.mean() * 3 / side), 2))][0]


def object_attributes(obj: ShapeObject, cell: str) -> dict[str, str]:
    """The attributes a caption states about ``obj`` (keys: ATTRIBUTES)."""
    return {"size": obj.size, "colour": obj.colour, "shape": obj.shape, "cell": cell}


def matching_objects(attrs: list[dict[str, str]], cells: list[set[str]], query: dict[str, str]) -> list[int]:
    """Indices of the objects that ``query`` (any subset of ATTRIBUTES) describes: every stated attribute but the cell
    equals the object's, and a stated cell is one the object occupies (``cells[i]``: its one cell in an image, every
    cell it is seen in over a clip, so a phrase that fits another object in any frame does not pick one object)."""
    rest = {k: v for k, v in query.items() if k != "cell"}
    return [i for i, (own, occupied) in enumerate(zip(attrs, cells))
            if all(own[k] == v for k, v in rest.items()) and ("cell" not in query or query["cell"] in occupied)]


def shape_polygon(obj: ShapeObject) -> list[tuple[float, float]]:
    """Vertices of a non-circle shape around ``obj.centre`` (radius = farthest vertex)."""
    cx, cy = obj.centre
    if obj.shape == "square":
        radii, turns = [obj.radius] * 4, [math.pi / 4 + k * math.pi / 2 for k in range(4)]
    elif obj.shape == "triangle":
        radii, turns = [obj.radius] * 3, [k * 2 * math.pi / 3 for k in range(3)]
    elif obj.shape == "star":
        radii, turns = [obj.radius, 0.45 * obj.radius] * 5, [k * math.pi / 5 for k in range(10)]
    elif obj.shape == "cross":  # plus sign, arms of half-width 0.33 r
        a, b = 0.33, 1.0
        pts = [(a, b), (a, a), (b, a), (b, -a), (a, -a), (a, -b), (-a, -b), (-a, -a), (-b, -a),
               (-b, a), (-a, a), (-a, b)]
        scale = obj.radius / math.hypot(a, b)
        radii = [scale * math.hypot(x, y) for x, y in pts]
        turns = [math.atan2(y, x) for x, y in pts]
    else:
        raise ValueError(f"unknown shape {obj.shape!r}; expected one of {SHAPES}")
    return [(cx + r * math.cos(t + obj.angle), cy + r * math.sin(t + obj.angle))
            for r, t in zip(radii, turns)]


def shape_mask(obj: ShapeObject, side: int) -> np.ndarray:
    """Exact bool ``[side, side]`` mask of the full shape, rasterised by PIL without anti-aliasing."""
    canvas = PIL.Image.new("1", (side, side), 0)
    draw = PIL.ImageDraw.Draw(canvas)
    if obj.shape == "circle":
        cx, cy = obj.centre
        draw.ellipse([cx - obj.radius, cy - obj.radius, cx + obj.radius, cy + obj.radius], fill=1)
    else:
        draw.polygon(shape_polygon(obj), fill=1)
    return np.asarray(canvas, dtype=bool)


def _other(options, value, rng: np.random.Generator):
    """A uniformly drawn option different from ``value``."""
    rest = [o for o in options if o != value]
    return rest[rng.integers(len(rest))]


def pick_attributes(rng: np.random.Generator, n_objects: int) -> list[tuple[str, str, str]]:
    """(shape, colour, size) per object; object 0 is the target, object 1 shares one attribute."""
    def draw(options):
        return list(options)[rng.integers(len(options))]

    target = (draw(SHAPES), draw(COLOURS), draw(SIZES))
    picked = [target]
    for k in range(1, n_objects):
        shape, colour = draw(SHAPES), draw(COLOURS)
        if k == 1 or rng.random() < 0.5:  # share exactly one of colour / shape with the target
            if rng.random() < 0.5:
                shape, colour = target[0], _other(COLOURS, target[1], rng)
            else:
                shape, colour = _other(SHAPES, target[0], rng), target[1]
        picked.append((shape, colour, draw(SIZES)))
    return picked


def draw_object(rng: np.random.Generator, shape: str, colour: str, size: str, side: int) -> ShapeObject:
    """An object of the given attributes with random radius, centre (wholly inside the image), fill and rotation."""
    radius = rng.uniform(*SIZES[size]) * side
    centre = tuple(rng.uniform(radius + 2, side - radius - 2, size=2))
    jitter = rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=3)
    fill = tuple(int(v) for v in np.clip(np.array(COLOURS[colour]) + jitter, 0, 255))
    return ShapeObject(shape, colour, size, centre, radius, rng.uniform(0, 2 * math.pi), fill)


def occlude(full: np.ndarray) -> np.ndarray:
    """Visible masks from full shape masks ``[n, ...]`` in paint order: later objects paint on top."""
    visible, covered = np.empty_like(full), np.zeros_like(full[0])
    for i in range(len(full) - 1, -1, -1):
        visible[i] = full[i] & ~covered
        covered |= full[i]
    return visible


def place_scene(rng: np.random.Generator, attrs: list[tuple[str, str, str]], side: int) -> Scene | None:
    """Random geometry for the given attributes, in random paint order; None if a rule fails."""
    order = rng.permutation(len(attrs))
    objects = [draw_object(rng, *attrs[i], side) for i in order]
    full = np.stack([shape_mask(obj, side) for obj in objects])        # [n, H, W]
    visible = occlude(full)
    if (visible.sum(axis=(1, 2)) < MIN_VISIBLE * full.sum(axis=(1, 2))).any():
        return None
    scene = Scene(objects, visible, target=int(np.flatnonzero(order == 0)[0]))
    keys = [tuple(a.values()) for a in scene.attrs]
    return scene if len(set(keys)) == len(keys) else None


def sample_scene(rng: np.random.Generator, side: int, min_objects: int = 1,
                 max_objects: int = 4, max_tries: int = 50, place=place_scene):
    """Draw a scene that satisfies the module's rules (fewer objects if placement keeps failing).

    ``place(rng, attrs, side)`` lays out objects of the (shape, colour, size) triples ``attrs`` (the target first) and
    returns the scene, or None when a rule fails; the default places one image, the video world passes a clip's."""
    n_objects = int(rng.integers(min_objects, max_objects + 1))
    while True:
        attrs = pick_attributes(rng, n_objects)
        for _ in range(max_tries):
            scene = place(rng, attrs, side)
            if scene is not None:
                return scene
        n_objects -= 1  # a single object always fits, so this terminates


def _noun_phrase(attrs: dict[str, str], keys) -> str:
    words = [attrs[k] for k in ("size", "colour") if k in keys] + [attrs["shape"]]
    if "cell" in keys:
        words.append(dict(CELL_PHRASES.values())[attrs["cell"]])
    return " ".join(words)


def canonical_caption(attrs: dict[str, str]) -> str:
    """``"a big red circle in the top left"``: all four attributes, unique within its scene."""
    return "a " + _noun_phrase(attrs, ATTRIBUTES)


def referring_expressions(scene, index: int, max_short: int = 2) -> list[str]:
    """Distinct phrasings that each pick out object ``index`` alone: the shortest identifying
    attribute sets first (up to ``max_short``), then three paraphrases of the full description.

    ``scene`` is anything with ``attrs`` and ``referents`` (a :class:`Scene`, or a clip of the video world); its
    sampler guarantees that the full description picks out ``index`` alone."""
    attrs = scene.attrs[index]
    phrases = []
    for keys in _SHORT_SETS:
        if len(phrases) < max_short and scene.referents({k: attrs[k] for k in keys}) == [index]:
            phrases.append("the " + _noun_phrase(attrs, keys))
    position = dict(CELL_PHRASES.values())[attrs["cell"]]
    phrases += ["the " + _noun_phrase(attrs, ATTRIBUTES),
                f"the {attrs['colour']} {attrs['shape']} {position} that is {attrs['size']}",
                f"the {attrs['size']} {attrs['shape']} {position} whose colour is {attrs['colour']}"]
    return list(dict.fromkeys(phrases))


def parse_phrase(text: str) -> dict[str, str]:
    """Inverse of the grammar: the attributes a caption or expression states."""
    words = text.lower().replace(",", " ").split()
    found = {}
    for key, names in (("size", SIZES), ("colour", COLOURS), ("shape", SHAPES)):
        hits = [w for w in words if w in names]
        if hits:
            found[key] = hits[0]
    joined = " ".join(words)
    for name, phrase in sorted(CELL_PHRASES.values(), key=lambda item: -len(item[1])):
        if phrase in joined:
            found["cell"] = name
            break
    return found

