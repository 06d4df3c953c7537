"""Pipeline functions written the way popular libraries document them for
tf.numpy_function / tf.py_function (tests/pipelines/test_pipelines_real_code.py).
A module of its own, importing only the standard library, NumPy and PIL, so
that pool workers import it without TensorFlow."""
import io

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255
VOCAB = {"the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5}


def normalize(img):
    # torchvision-style normalisation, in place, as tutorials write it.
    img -= MEAN
    img /= STD
    return img


def shuffle_tokens(ids, seed):
    rng = np.random.default_rng(int(seed))
    rng.shuffle(ids)  # in place
    return ids


def flip_in_place(img):
    img[:] = img[:, ::-1].copy()  # as OpenCV's cv2.flip(img, 1, dst=img) does
    return img


def tokenize_text(text):
    """A tokenizer for tf.py_function: np.array of a list of ints is int64."""
    words = text.numpy().decode().split() if hasattr(text, "numpy") else text.decode().split()
    return np.array([VOCAB.get(w, 0) for w in words])


def tokenize_for_numpy_function(text):
    return np.array([VOCAB.get(w, 0) for w in text.decode().split()], np.int32)


def decode_png(data):
    from PIL import Image
    if isinstance(data, np.ndarray):  # eagerly a 0-d object array, in graphs bytes
        data = data.item()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()


def parse_int(text):
    return np.int64(int(text))  # ValueError on a bad record


def random_noise(n):
    """np.random.rand-style float64 for a float32 Tout (tf.py_function converts)."""
    return np.random.default_rng(int(n)).random(4)
