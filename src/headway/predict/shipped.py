"""The predictor that ships inside the package: a fine-tuned checkpoint as low-rank deltas over the
bundled MiniLM, scored on ONNX Runtime without torch.

:func:`pack_checkpoint` (needs numpy and safetensors, not torch) subtracts the bundled encoder's weights
from a fine-tuned checkpoint's and keeps each weight matrix's change as a rank-``r`` product (truncated
SVD, float16); vectors and the position table are kept whole. :class:`ShippedPredictor` adds the deltas
back, writes the ONNX graph (:func:`headway.predict.encoder.build_encoder_onnx`, cached under
``$HEADWAY_CACHE_DIR/derived/``) and scores prompts with the checkpoint's head. ``--scorer default``
and ``pars.scorer=default`` use it when no predictor has been trained into the cache, so ``pars`` works
at first start with no training and no data folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import zipfile
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.predict._errors import CheckpointError
from headway.predict._paths import file_sha256
from headway.predict._text import scoring_text
from headway.predict.encoder import OnnxEncoder, build_encoder_onnx, encoder_onnx_path

__all__ = [
    "ALPACA_PREDICTOR",
    "MIX_PREDICTOR",
    "SHIPPED_PREDICTOR",
    "ShippedPredictor",
    "alpaca_predictor",
    "mix_predictor",
    "pack_checkpoint",
    "pack_linear_head",
    "read_pack_header",
    "shipped_predictor_path",
]

SHIPPED_PREDICTOR = "pars-minilm-default.npz"
"""File name of the packaged predictor under ``headway/predict/weights/``."""

_F16_MIN_SIZE = 1024
"""Arrays of at least this many values are stored as float16; smaller ones (biases, norms) as float32."""


MIX_PREDICTOR = "pars-minilm-mix.npz"
"""File name of the packaged alternative: a linear head over the frozen bundled MiniLM (mean pooling),
fitted on every shared-data source by the cross-source command's chosen recipe (``--save-head``)."""


def shipped_predictor_path(name: str = SHIPPED_PREDICTOR) -> Path:
    return Path(str(resources.files("headway.predict") / "weights" / name))


ALPACA_PREDICTOR = "pars-minilm-alpaca.npz"
"""File name of the packaged predictor trained on alpaca_eval alone (the default until it was chosen by
tau_b on sources it never saw): MiniLM fully fine-tuned on alpaca_eval's consensus lengths, rank-32 deltas.
The online-adaptation replay starts from it (an offline predictor that never saw arena_hard_v2)."""


def alpaca_predictor() -> ShippedPredictor:
    """The packaged :data:`ALPACA_PREDICTOR` (scorer spec ``headway.predict.shipped:alpaca_predictor()``)."""
    return ShippedPredictor(shipped_predictor_path(ALPACA_PREDICTOR))


def mix_predictor() -> ShippedPredictor:
    """The packaged :data:`MIX_PREDICTOR` (scorer spec ``headway.predict.shipped:mix_predictor()``)."""
    return ShippedPredictor(shipped_predictor_path(MIX_PREDICTOR))


def pack_linear_head(
    weights: npt.ArrayLike,
    bias: float,
    out: str | Path,
    *,
    max_length: int,
    base: str | Path | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``out`` (``.npz``): a predictor that scores ``mean-pooled embedding @ weights + bias`` with
    the base encoder's own weights (no deltas), loadable by :class:`ShippedPredictor`."""
    from headway.predict._paths import default_encoder_path

    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(w)) or not np.isfinite(bias):
        raise ValueError("pack_linear_head: weights and bias must be finite")
    base_dir = Path(base) if base is not None else default_encoder_path()
    header = {
        "format": 1,
        "pooling": "mean",
        "max_length": int(max_length),
        "rank": 0,
        "base_sha256": file_sha256(base_dir / "model.safetensors"),
        "meta": meta or {},
    }
    buf = io.BytesIO()
    savez: Any = np.savez_compressed  # its **arrays are typed as its keyword options
    savez(
        buf,
        header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8),
        **{"head.weight": w.astype(np.float32).reshape(1, -1), "head.bias": np.array([bias], dtype=np.float32)},
    )
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(buf.getvalue())
    header["bytes"] = dst.stat().st_size
    return header


def pack_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    rank: int = 32,
    base: str | Path | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the checkpoint's change over ``base`` (default: the bundled encoder) to ``out`` (``.npz``);
    returns the header written (pooling, max length, rank, sizes)."""
    from safetensors.numpy import load_file

    from headway.predict._paths import default_encoder_path
    from headway.predict.encoder import _weights

    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    ckpt = Path(checkpoint)
    try:
        info = json.loads((ckpt / "predictor.json").read_text())
        tuned = load_file(str(ckpt / "model.safetensors"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{ckpt}: not a readable predictor checkpoint ({exc})") from None
    base_dir = Path(base) if base is not None else default_encoder_path()
    stock = _weights(base_dir)
    arrays: dict[str, npt.NDArray[Any]] = {}
    for key, value in tuned.items():
        if key.startswith("head."):
            arrays[key] = value.astype(np.float32)
            continue
        name = key.removeprefix("encoder.")
        if not key.startswith("encoder.") or name.endswith("position_ids"):
            continue
        if name not in stock or stock[name].shape != value.shape:
            raise CheckpointError(f"{ckpt}: {name} does not match the base encoder {base_dir}")
        delta = value.astype(np.float64) - stock[name].astype(np.float64)
        if not np.any(delta):
            continue
        if delta.ndim == 2 and "position_embeddings" not in name and min(delta.shape) > rank:
            u, s, vt = np.linalg.svd(delta, full_matrices=False)
            arrays[f"low.{name}.a"] = (u[:, :rank] * s[:rank]).astype(np.float16)
            arrays[f"low.{name}.b"] = vt[:rank].astype(np.float16)
        else:
            arrays[f"full.{name}"] = delta.astype(np.float16 if delta.size >= _F16_MIN_SIZE else np.float32)
    if "head.weight" not in arrays:
        raise CheckpointError(f"{ckpt}: no head weights")
    layers = (info.get("encoder") or {}).get("num_layers")  # the encoder cut to its first layers
    header = {
        "format": 1,
        "pooling": str(info.get("pooling") or "pooler"),
        "max_length": int(info.get("max_length", 128)),
        "rank": rank,
        "base_sha256": file_sha256(base_dir / "model.safetensors"),
        "meta": meta or {},
    }
    if layers is not None:
        header["encoder_layers"] = int(layers)
    buf = io.BytesIO()
    savez: Any = np.savez_compressed  # its **arrays are typed as its keyword options
    savez(buf, header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8), **arrays)
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(buf.getvalue())
    header["bytes"] = dst.stat().st_size
    return header


_PACK_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)  # EOFError: an empty file


def _open_pack(
    path: Path, raw: bytes | None = None, arrays: bool = True
) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The header and (``arrays``) the arrays of the pack at ``path``, or in ``raw``, its bytes read
    already (CheckpointError naming it); without arrays, none of them is read (an npz's members are
    read when indexed)."""
    try:
        with np.load(io.BytesIO(raw) if raw is not None else path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            members = {k: z[k] for k in z.files if k != "header"} if arrays else {}
    except _PACK_ERRORS as exc:
        raise CheckpointError(f"{path}: not a packed predictor ({exc})") from None
    damaged = [k for k, v in members.items() if not isinstance(v, np.ndarray)]  # np.load gives such members as bytes
    if damaged:
        raise CheckpointError(f"{path}: not a packed predictor ({damaged[0]!r} is not an array)")
    return header, members


def _read_pack(path: Path) -> tuple[bytes, dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The bytes, header and arrays of the pack at ``path`` (CheckpointError naming it)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: not a packed predictor ({exc})") from None
    return (raw, *_open_pack(path, raw))


def read_pack_header(path: str | Path | None = None) -> dict[str, Any]:
    """A packed predictor's header (default: the shipped one's), reading none of its arrays."""
    return _open_pack(Path(path) if path is not None else shipped_predictor_path(), arrays=False)[0]


_log = logging.getLogger("headway.predict.shipped")


class _QuantizationChatter(logging.Filter):
    """Drops the records ONNX Runtime's quantization tools log on the root logger itself
    (``logging.info(...)``: a line per tensor, and a hint to pre-process the model first) below
    ERROR; other records pass."""

    def __init__(self, package_dir: str) -> None:
        super().__init__()
        self.package_dir = package_dir

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.pathname.startswith(self.package_dir)


@contextlib.contextmanager
def _quiet_quantization() -> Iterator[None]:
    """While quantizing: ONNX Runtime's quantization logging below ERROR is silenced (on the root
    logger, which it mostly logs on, and its own ``onnxruntime`` loggers); restored afterwards."""
    import onnxruntime.quantization

    chatter = _QuantizationChatter(str(Path(onnxruntime.quantization.__file__).parent))
    root, own = logging.getLogger(), logging.getLogger("onnxruntime")
    level = own.level
    root.addFilter(chatter)
    own.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.removeFilter(chatter)
        own.setLevel(level)


def _quantize(graph: Path, into: Path) -> None:
    """Write ``graph``'s int8 copy (weights int8, activations quantized per row) to ``into``, once:
    later starts find it there."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from headway.predict._rowquant import quantize_rows

    _log.info("building the int8 scorer once (a few seconds); cached at %s", into)
    tmp = into.with_name(f".{into.name}.tmp")
    try:
        with _quiet_quantization():
            quantize_dynamic(str(graph), str(tmp), weight_type=QuantType.QInt8)
        quantize_rows(tmp)
        tmp.replace(into)
    finally:
        tmp.unlink(missing_ok=True)


class ShippedPredictor:
    """Scores prompts with a packed predictor (default: the one in the package); torch-free.

    ``score(prompts)`` returns one float per prompt, higher for a longer expected answer (the
    ranking the ``pars`` policy needs).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        threads: int = 2,
        batch_size: int = 32,
        max_length: int | None = None,
        base: str | Path | None = None,
        int8: bool = False,
    ) -> None:
        """``int8``: score with an int8-quantized copy of the graph (ONNX Runtime's dynamic quantization,
        activations quantized per token: a prompt's score does not depend on its batch)."""
        from headway.predict._paths import default_encoder_path
        from headway.predict.encoder import _weights

        self.path = Path(path) if path is not None else shipped_predictor_path()
        raw, header, arrays = _read_pack(self.path)
        self.meta: dict[str, Any] = header
        base_dir = Path(base) if base is not None else default_encoder_path()
        digest = hashlib.sha256(raw).hexdigest()[:16]
        self.fingerprint = f"{self.path.name}:{digest}"
        """The pack's name and content hash: what an online learner's saved windows are checked against
        (the features are the pack's however it is run: float or int8 graph, any prompt cut)."""
        graph = encoder_onnx_path(base_dir, f"packed:{digest}:{header['pooling']}")
        if not graph.is_file():
            if file_sha256(base_dir / "model.safetensors") != header["base_sha256"]:
                raise CheckpointError(f"{self.path}: packed over other encoder weights than {base_dir}'s")
            weights = _weights(base_dir)
            for key, value in arrays.items():
                kind, _, name = key.partition(".")
                if kind == "full":
                    weights[name] = (weights[name] + value.astype(np.float32)).astype(np.float32)
                elif kind == "low" and name.endswith(".a"):
                    target = name.removesuffix(".a")
                    b = arrays[f"low.{target}.b"].astype(np.float32)
                    weights[target] = (weights[target] + value.astype(np.float32) @ b).astype(np.float32)
            layers = header.get("encoder_layers")  # a predictor on the encoder's first layers: the rest never run
            build_encoder_onnx(base_dir, graph, weights=weights, pooling=str(header["pooling"]),
                               num_layers=None if layers is None else int(layers))  # fmt: skip
        if int8:
            # (".int8.onnx" files, quantized per batch, are left unused: see _rowquant)
            quantized = graph.with_suffix(".int8-rows.onnx")
            if not quantized.is_file():
                _quantize(graph, quantized)
            graph = quantized
        self.head_weight = arrays["head.weight"].astype(np.float64).reshape(-1)
        self.head_bias = float(arrays["head.bias"].reshape(-1)[0])
        length = int(header["max_length"]) if max_length is None else max_length
        self.encoder = OnnxEncoder(base_dir, max_length=length, threads=threads, batch_size=batch_size, graph=graph)
        self.max_length = self.encoder.max_length
        self.backend = "onnx-int8 (packed)" if int8 else "onnx (packed)"

    @property
    def trained_on(self) -> list[str]:
        """The shared-data sources the packed predictor was trained on, as its header records them
        (``trained_on``; heads packed by ``cross-source --save-head`` before it, ``sources``; older packs
        name one data spec, ``source``, such as ``alpaca_eval:mean``)."""
        meta = self.meta.get("meta") or {}
        for key in ("trained_on", "sources"):
            if key in meta:
                return [str(x) for x in meta[key]]
        return [str(meta["source"]).partition(":")[0]] if "source" in meta else []

    def embed(self, prompts: Sequence[str]) -> npt.NDArray[np.float32]:
        """The pooled features the head scores (what an online learner refits on), of each prompt's
        :func:`~headway.predict.score.scoring_text` (its first ``max_length * MAX_CHARS_PER_TOKEN``
        characters, lone surrogates replaced): the text a :class:`~headway.predict.Scorer`, the
        gateway and the plugin read of it, so that the simulator scores a prompt as they do."""
        return self.encoder.embed([scoring_text(p, self.max_length) for p in prompts])

    def score_embeddings(self, embeddings: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = np.asarray(embeddings, dtype=np.float64) @ self.head_weight + self.head_bias
        return out

    def score(self, prompts: Sequence[str]) -> npt.NDArray[np.float64]:
        return self.score_embeddings(self.embed(list(prompts)))
