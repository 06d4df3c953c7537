"""The functions benchmarks/pipelines.py maps, and their data.

A module without TensorFlow: a ProcessPool's workers, torch DataLoader's and
Grain's spawned workers import it to run these functions (gil_work.py says
why that matters).
"""
import io
import random
import re

import numpy as np

LENGTH = 32  # tokens per text, padded or cut
_WORD = re.compile(r"[a-z0-9']+")
_rng = random.Random(44)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = sorted({"".join(_rng.choice(_LETTERS) for _ in range(_rng.randint(2, 9)))
                for _ in range(6000)})
# Token ids from 2 (0: padding, 1: unknown).
VOCABULARY = {word: i + 2 for i, word in enumerate(WORDS)}


def texts(n, seed=0):
    """`n` short texts: 5 to 25 words, capitalized and punctuated, some unknown."""
    rng = random.Random(seed)
    found = []
    for _ in range(n):
        words = [rng.choice(WORDS) if rng.random() < 0.95 else "Zq" + str(rng.randint(0, 99))
                 for _ in range(rng.randint(5, 25))]
        words[0] = words[0].capitalize()
        found.append((" ".join(words) + rng.choice(".!?")).encode())
    return found


def tokenize(text):
    """A pure-Python tokenizer: regex split, lowercasing, dictionary lookup,
    padding to LENGTH."""
    if not isinstance(text, str):
        text = bytes(text).decode()
    ids = [VOCABULARY.get(word, 1) for word in _WORD.findall(text.lower())][:LENGTH]
    return np.array(ids + [0] * (LENGTH - len(ids)), np.int32)


def jpegs(n, size=64, seed=0):
    """`n` small JPEGs, made in memory with PIL."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    found = []
    for _ in range(n):
        a, b, c = rng.integers(1, 8, 3)
        pixels = np.stack([(x * a + y * b) % 256, (x * c) % 256, (y * a + 40) % 256], -1)
        pixels = (pixels + rng.integers(0, 30, pixels.shape)).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        found.append(out.getvalue())
    return found


def decode(data):
    """A JPEG decoded with PIL, as an RGB uint8 array."""
    from PIL import Image
    return np.array(Image.open(io.BytesIO(bytes(data))).convert("RGB"))


class Mapped:
    """`function` over `items` as a map-style torch Dataset."""

    def __init__(self, items, function):
        self.items, self.function = items, function

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.function(self.items[i])
