"""Serving-time scoring: batched, dynamically padded, cached by prompt hash; torch or ONNX Runtime.

``Scorer.score(prompts)`` returns one float per prompt, higher = longer expected output. The ``pars``
policy orders by it; :func:`score_workload` precomputes scores for a simulator workload.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, get_args

import numpy as np
import numpy.typing as npt

from headway.predict._chunks import _padding_chunks
from headway.predict._errors import CheckpointError
from headway.predict._paths import default_cache_dir, file_sha256, set_offline
from headway.predict._resolve import MIN_SCORING_LENGTH

if TYPE_CHECKING:
    from headway.predict.model import LengthPredictor
    from headway.predict.shipped import ShippedPredictor
    from headway.predict.train import TrainConfig
    from headway.workload import Workload

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "MIN_SCORING_LENGTH",
    "CacheInfo",
    "OnnxBackend",
    "Scorer",
    "ScoringLengthError",
    "TorchBackend",
    "default_scorer",
    "derived_dir",
    "ensure_predictor",
    "export_onnx",
    "quantize_onnx",
    "score_workload",
    "scoring_backend",
    "scoring_text",
]

Backend = Literal["torch", "onnx", "onnx-int8"]
BACKENDS: tuple[str, ...] = get_args(Backend)
"""The scoring backends by name (``--backend`` and ``scorer_backend`` choices)."""


def scoring_backend(name: str) -> Backend:
    """``name`` as a :data:`Backend`; ValueError naming the choices when it is none of them."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; use {', '.join(BACKENDS)}")
    return cast("Backend", name)


class ScoringLengthError(ValueError):
    """A scoring ``max_length`` outside ``MIN_SCORING_LENGTH`` .. the checkpoint's own length."""


ONNX_FILE = "model.onnx"
_ONNX_SIDECAR = "model.onnx.json"
ONNX_INT8_FILE = "model.int8.onnx"
_INT8_SIDECAR = "model.int8.onnx.json"


class _Runner(Protocol):
    name: str

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]: ...


class TorchBackend:
    """Runs a :class:`LengthPredictor` in inference mode."""

    name = "torch"

    def __init__(self, model: LengthPredictor) -> None:
        self.model = model.eval()

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        import torch

        with torch.inference_mode():
            out = self.model(torch.from_numpy(input_ids), torch.from_numpy(attention_mask))
        return np.asarray(out.float().numpy())


class OnnxBackend:
    """Runs an exported ``model.onnx`` with ONNX Runtime's CPU provider.

    ONNX Runtime's worker threads busy-wait for the next run (its default).
    ``HEADWAY_ORT_SPINNING=0`` makes them sleep instead (``session.intra_op.allow_spinning``),
    which frees CPU on shared cores; in the gateway's burst benchmark it did not change latency
    (the gateway's measurement notes, ``git show 403bc55:benchmarks/results/gateway.md``).
    """

    def __init__(self, path: str | Path, threads: int = 2, *, name: str = "onnx") -> None:
        import onnxruntime as ort

        self.name = name
        """The backend's name (``onnx``, or ``onnx-int8`` for the quantized model)."""

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        spinning = os.environ.get("HEADWAY_ORT_SPINNING", "1")
        if spinning not in ("0", "1"):
            raise ValueError(f"HEADWAY_ORT_SPINNING must be 0 or 1, got {spinning!r}")
        opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise CheckpointError(f"{path}: ONNX Runtime cannot load it ({exc})") from exc

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        out = self.session.run(["score"], {"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(out[0])


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int


def _hash(prompt: str) -> bytes:
    # surrogatepass: a lone surrogate (JSON "\\ud800") hashes too; it never raises
    return hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


MAX_CHARS_PER_TOKEN = 32
"""The scorer reads at most ``max_length * MAX_CHARS_PER_TOKEN`` characters of a prompt: the
tokenizer keeps ``max_length`` tokens anyway, but tokenizes the whole text first, so the cost would
grow with the prompt (a megabyte-long prompt took over a second). A WordPiece token spans a few characters (a word
over 100 characters is one ``[UNK]``), so the prefix holds the tokens kept unless the prompt is
mostly whitespace."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def scoring_text(prompt: str, max_length: int) -> str:
    """The part of ``prompt`` the scorer reads: its first ``max_length * MAX_CHARS_PER_TOKEN``
    characters, each lone surrogate (JSON ``"\\ud800"``, which the tokenizer refuses: no UTF-8
    text holds one) replaced by U+FFFD, as a UTF-8 decoder replaces an invalid sequence."""
    return _SURROGATE.sub("\ufffd", prompt[: max_length * MAX_CHARS_PER_TOKEN])


def _scoring_length(requested: int | None, trained: int) -> int:
    """The prompt length to score at: ``requested`` (``MIN_SCORING_LENGTH`` tokens up to the
    checkpoint's own), or the checkpoint's."""
    if requested is None:
        return trained
    if not MIN_SCORING_LENGTH <= requested <= trained:
        raise ScoringLengthError(
            f"max_length must be {MIN_SCORING_LENGTH}..{trained} tokens (the checkpoint's length), got {requested}"
        )
    return requested


class Scorer:
    """Scores prompts with a trained predictor.

    Prompts are tokenized (truncated to ``max_length``), sorted by length and run in batches of
    at most ``batch_size``, each padded only to its longest prompt. The batch boundaries are the
    ones that run the fewest tokens, padding included, counting each forward pass as
    :data:`_PASS_COST_TOKENS` more (:func:`_padding_chunks`): prompts that arrive together (a
    gateway's scoring batch) are often mostly short with a few long ones, and one batch padded to
    the longest took about twice as long (``benchmarks/results/predictor_bench_padding.md``).
    Scores are cached (LRU, ``cache_size`` entries, 0 disables) under a 128-bit BLAKE2b hash of
    the prompt text.

    The int8 model quantizes activations per batch (dynamic quantization), so its scores move
    a little with the batch a prompt lands in (by up to about 0.17 for scores with a standard
    deviation of 1.4 on alpaca_eval); the float backends do not.
    """

    def __init__(
        self,
        runner: _Runner,
        tokenizer: Any,
        *,
        max_length: int = 128,
        batch_size: int = 32,
        cache_size: int = 100_000,
        name: str = "",
        meta: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache_size = max(0, cache_size)
        self.name = name
        self.meta = dict(meta or {})
        self._pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._hits = 0
        self._misses = 0

    @property
    def backend(self) -> str:
        return self.runner.name

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        backend: Backend = "torch",
        *,
        batch_size: int = 32,
        threads: int = 2,
        cache_size: int = 100_000,
        export_if_missing: bool = True,
        max_length: int | None = None,
    ) -> Scorer:
        """Load a checkpoint directory for scoring. With ``backend="onnx"``, ``model.onnx`` in the
        checkpoint is used (exported first when missing or stale and ``export_if_missing``); with
        ``"onnx-int8"``, its dynamically int8-quantized copy ``model.int8.onnx`` (made the same way;
        about twice as fast on CPU, see ``benchmarks/results/predictor_bench.md``).

        ``max_length`` truncates prompts at scoring time to fewer tokens than the checkpoint was
        trained with (default: the checkpoint's): scoring time grows with the longest prompts."""
        import torch

        from headway.predict.model import (
            checkpoint_max_length,
            load_checkpoint,
            read_checkpoint_meta,
            verify_checkpoint_files,
        )

        torch.set_num_threads(max(1, threads))
        p = Path(path).expanduser().resolve()
        if backend == "torch":
            loaded = load_checkpoint(p)
            return cls(
                TorchBackend(loaded.model),
                loaded.tokenizer,
                max_length=_scoring_length(max_length, loaded.max_length),
                batch_size=batch_size,
                cache_size=cache_size,
                name=p.name,
                meta=loaded.meta,
            )
        scoring_backend(backend)
        meta = read_checkpoint_meta(p)
        hashes = verify_checkpoint_files(p, meta)
        where = _derived_dir(p, hashes, backend)
        onnx_path = where / ONNX_FILE
        problem = _onnx_problem(where, hashes)
        if problem:
            if not export_if_missing:
                raise CheckpointError(f"{onnx_path}: {problem}; run `headway predictor export-onnx --model {p}`")
            export_onnx(p, into=where)
        if backend == "onnx-int8":
            int8_path = where / ONNX_INT8_FILE
            problem = _int8_problem(where)
            if problem:
                if not export_if_missing:
                    raise CheckpointError(
                        f"{int8_path}: {problem}; run `headway predictor export-onnx --int8 --model {p}`"
                    )
                quantize_onnx(p, into=where)
            onnx_path = int8_path
        set_offline()
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(p / "tokenizer"), local_files_only=True)
        return cls(
            OnnxBackend(onnx_path, threads, name=backend),
            tokenizer,
            max_length=_scoring_length(max_length, checkpoint_max_length(p, meta)),
            batch_size=batch_size,
            cache_size=cache_size,
            name=p.name,
            meta=meta,
        )

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, len(self._cache), self.cache_size)

    def clear_cache(self) -> None:
        self._cache.clear()
        self._hits = self._misses = 0

    def score_one(self, prompt: str) -> float:
        return float(self.score([prompt])[0])

    def score(self, prompts: Sequence[str]) -> npt.NDArray[np.float64]:
        """One score per prompt (higher = longer output expected). An empty or blank prompt is a
        request too (a client may send one): it is scored as its tokenizer's special tokens alone.
        Each prompt is read as :func:`scoring_text` (a bounded prefix, lone surrogates replaced)."""
        if isinstance(prompts, str):
            raise TypeError("score() takes a sequence of prompts; use score_one() for one prompt")
        out = np.empty(len(prompts), dtype=np.float64)
        todo: dict[bytes, list[int]] = {}
        texts_of: dict[bytes, str] = {}
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise TypeError(f"prompt {i} is not a string: {prompt!r:.40}")
            text = scoring_text(prompt, self.max_length)
            key = _hash(text)
            cached = self._cache.get(key) if self.cache_size else None
            if cached is not None:
                self._cache.move_to_end(key)
                out[i] = cached
                self._hits += 1
            else:
                todo.setdefault(key, []).append(i)
                texts_of.setdefault(key, text)
        if todo:
            self._misses += len(todo)
            keys = list(todo)
            texts = [texts_of[k] for k in keys]
            scores = self._run(texts)
            for key, s in zip(keys, scores, strict=True):
                out[todo[key]] = s
                if self.cache_size:
                    self._cache[key] = float(s)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

    def _run(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        from headway.predict.model import pad_batch, tokenize

        ids = tokenize(self.tokenizer, texts, self.max_length)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        result = np.empty(len(ids), dtype=np.float64)
        for a, b in _padding_chunks([len(ids[i]) for i in order], self.batch_size):
            chunk = order[a:b]
            input_ids, mask = pad_batch([ids[i] for i in chunk], self._pad_id)
            result[chunk] = self.runner.run(input_ids, mask).reshape(-1)
        return result


# ---------------------------------------------------------------------------------------------------------
# ONNX export


def _derived_problem(
    path: Path, sidecar: Path, what: str, source: tuple[str, str | None], own_key: str, stale: str
) -> str | None:
    """Why ``path``, a file derived from a checkpoint and described by the JSON ``sidecar``, cannot be
    used (missing; made from another ``source`` = (sidecar key, current hash); or its hash, under
    ``own_key``, no longer matches); None if it can."""
    if not path.is_file():
        return f"no {what}"
    try:
        info = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError):
        return f"missing or corrupt {sidecar.name}"
    if info.get(source[0]) != source[1]:
        return stale
    if info.get(own_key) != file_sha256(path):
        return f"{what} is corrupt or was modified"
    return None


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


def derived_dir(checkpoint: str | Path, backend: Backend = "onnx-int8") -> Path:
    """Where the ONNX files of ``checkpoint`` for ``backend`` are (or will be exported to): the
    checkpoint directory, unless it is read-only and lacks usable ones; then a cache directory
    named by the checkpoint's weights, ``<cache>/derived/<first 16 hex digits of their SHA-256>``
    (a checkpoint on a read-only volume still gets its exports, once)."""
    from headway.predict.model import read_checkpoint_meta, verify_checkpoint_files

    p = Path(checkpoint).expanduser().resolve()
    return _derived_dir(p, verify_checkpoint_files(p, read_checkpoint_meta(p)), backend)


def _derived_dir(p: Path, hashes: dict[str, str], backend: Backend) -> Path:
    usable = _onnx_problem(p, hashes) is None and (backend != "onnx-int8" or _int8_problem(p) is None)
    if usable or _writable(p):
        return p
    return default_cache_dir() / "derived" / hashes["model.safetensors"][:16]


def _onnx_problem(ckpt: Path, hashes: dict[str, str]) -> str | None:
    weights = ("weights_sha256", hashes.get("model.safetensors"))
    stale = "stale ONNX export (the weights changed since)"
    return _derived_problem(ckpt / ONNX_FILE, ckpt / _ONNX_SIDECAR, "ONNX export", weights, "onnx_sha256", stale)


MIN_OPSET = 14
"""The lowest ONNX opset the encoders export to (their attention, ``scaled_dot_product_attention``)."""


def _check_opset(opset: int) -> None:
    from torch.onnx import _constants

    top = int(getattr(_constants, "ONNX_MAX_OPSET", 20))
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= top:
        raise ValueError(
            f"opset must be {MIN_OPSET}..{top} (the ONNX opsets torch exports these encoders to), got {opset}"
        )


def _writable_target(path: Path, what: str) -> Path:
    """``path``, checked as a file to write (not a directory, its folder made); CheckpointError if not."""
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory; give the path of the {what} file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot make its folder ({exc.strerror or exc})") from None
    return path


def export_onnx(
    checkpoint: str | Path,
    out: str | Path | None = None,
    *,
    opset: int = 17,
    verify: bool = True,
    into: Path | None = None,
) -> Path:
    """Export a checkpoint to ONNX (inputs ``input_ids``, ``attention_mask`` int64 ``[batch, seq]``;
    output ``score`` ``[batch]``), by default to ``model.onnx`` in ``into`` (default
    :func:`derived_dir`: the checkpoint directory unless it is read-only), and check that ONNX
    Runtime reproduces the torch scores on batches of other shapes. ``opset``: :data:`MIN_OPSET` up to
    the newest torch exports (ValueError otherwise). The file is written beside its target and renamed
    into place once checked: a failed export leaves any earlier one as it was."""
    import torch

    from headway.predict.model import load_checkpoint, pad_batch, tokenize

    _check_opset(opset)
    loaded = load_checkpoint(checkpoint)
    model = loaded.model.eval()
    where = into if into is not None else _derived_dir(loaded.path, loaded.files_sha256, "onnx")
    target = _writable_target(Path(out) if out is not None else where / ONNX_FILE, "ONNX")
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    sample = ["Write a poem about the sea.", "What is 2 + 2?", "Explain " + "in detail " * 40]
    ids = tokenize(loaded.tokenizer, sample[:2], loaded.max_length)
    dummy = tuple(torch.from_numpy(a) for a in pad_batch(ids, pad_id))
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                dummy,
                str(tmp),
                input_names=["input_ids", "attention_mask"],
                output_names=["score"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "score": {0: "batch"},
                },
                opset_version=opset,
                dynamo=False,
            )
        if verify:
            runner = OnnxBackend(tmp, threads=torch.get_num_threads())
            for batch in (sample, sample[2:], sample[:1]):
                ii, mm = pad_batch(tokenize(loaded.tokenizer, batch, loaded.max_length), pad_id)
                with torch.inference_mode():
                    ref = model(torch.from_numpy(ii), torch.from_numpy(mm)).numpy()
                got = runner.run(ii, mm).reshape(-1)
                if not np.allclose(got, ref, atol=1e-3, rtol=1e-3):
                    raise CheckpointError(f"{target}: ONNX scores differ from torch ({got} vs {ref})")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    if out is None:
        sidecar = {
            "weights_sha256": loaded.files_sha256.get("model.safetensors"),
            "onnx_sha256": file_sha256(target),
            "opset": opset,
            "max_length": loaded.max_length,
        }
        (where / _ONNX_SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    return target


def _int8_problem(ckpt: Path) -> str | None:
    source = ("source_sha256", file_sha256(ckpt / ONNX_FILE))
    stale = "stale int8 model (model.onnx changed since)"
    path = ckpt / ONNX_INT8_FILE
    return _derived_problem(path, ckpt / _INT8_SIDECAR, "int8 ONNX model", source, "int8_sha256", stale)


_FFN_OUT = re.compile(r"layer\.(\d+)/(?:output/dense|ffn/lin2)/MatMul$")
"""ONNX node names of an encoder layer's feed-forward output projection (BERT, MPNet, RoBERTa:
``layer.N/output/dense``; DistilBERT: ``layer.N/ffn/lin2``): where activation outliers make int8
weights go wrong first."""


def _int8_ladder(source: Path) -> list[tuple[bool, list[str]]]:
    """The quantization settings :func:`quantize_onnx` tries, as ``(per_channel, nodes kept in float)``.

    After per-tensor and per-channel scales for every weight, the score head (ONNX nodes ``/head/...``)
    stays in float in every further setting: a frozen-encoder head has the feature standardization
    folded into it, weights up to about 1e4 beside small ones, which int8 rounds to zero (its one row
    is one channel, so per-channel scales do not help). The first two settings are as before this
    rung was added, so int8 models that passed them are made exactly as they were."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    # quantize_dynamic first rewrites a Gemm node NAME as a MatMul NAME_MatMul (and an Add): keep both names
    head = [name for n in graph.node if n.name.startswith("/head/") for name in (n.name, f"{n.name}_MatMul")]
    ffn = [(int(m.group(1)), n.name) for n in graph.node if n.op_type == "MatMul" and (m := _FFN_OUT.search(n.name))]
    steps: list[tuple[bool, list[str]]] = [(False, []), (True, []), (True, head)]
    if ffn:
        layers = max(i for i, _ in ffn) + 1
        for share in (0.25, 0.5, 1.0):
            first = layers - max(1, round(layers * share))
            kept = [*head, *(name for i, name in ffn if i >= first)]
            if kept != steps[-1][1]:
                steps.append((True, kept))
    return steps


def quantize_onnx(
    checkpoint: str | Path, out: str | Path | None = None, *, source: str | Path | None = None, into: Path | None = None
) -> Path:
    """Dynamically quantize ``model.onnx`` (exported first if missing or stale) to int8 weights,
    ``model.int8.onnx`` (ONNX Runtime's ``quantize_dynamic``), both in ``into`` (default
    :func:`derived_dir`), and check that it scores a few prompts as the float model does (each
    within a tenth of their spread). ``out`` writes the int8 model there instead (no sidecar, as
    :func:`export_onnx` with its ``out``), from ``source`` when given (an ONNX export of this
    checkpoint, e.g. one that :func:`export_onnx` wrote to its ``out``).

    Tries, in order, until one passes (:func:`_int8_ladder`): one scale per weight tensor; one per
    output channel; and then per-channel with the feed-forward output projections of the last
    quarter, half, or all of the encoder's layers left in float. The bundled MiniLM passes at the
    first step. all-mpnet-base-v2 fine-tuned on alpaca_eval needs the last half in float: held-out
    tau_b vs gpt4 0.620, against 0.612 for the float model and 0.577 per-channel throughout, which
    fails the check (``benchmarks/results/predictor_eval.md``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from headway.predict.model import checkpoint_max_length, read_checkpoint_meta, verify_checkpoint_files

    p = Path(checkpoint).expanduser().resolve()
    meta = read_checkpoint_meta(p)
    hashes = verify_checkpoint_files(p, meta)
    where = into if into is not None else _derived_dir(p, hashes, "onnx-int8")
    if source is None:
        if _onnx_problem(where, hashes):
            export_onnx(p, into=where)
        source = where / ONNX_FILE
    source = Path(source)
    target = _writable_target(Path(out) if out is not None else where / ONNX_INT8_FILE, "int8 ONNX")
    tmp = target.with_name(f".{target.name}.tmp")
    set_offline()
    from transformers import AutoTokenizer

    from headway.predict.model import pad_batch, tokenize

    tokenizer = AutoTokenizer.from_pretrained(str(p / "tokenizer"), local_files_only=True)
    sample = [
        "What is 2 + 2?", "Name a color.", "Write a poem about the sea.", "List ten cities in Europe.",
        "Explain how a transformer language model works, step by step, in detail.",
        "Write a 1000-word essay on the history of the Roman Empire.",
    ]  # fmt: skip
    ids = tokenize(tokenizer, sample, checkpoint_max_length(p, meta))
    ii, mm = pad_batch(ids, int(tokenizer.pad_token_id or 0))
    ref = OnnxBackend(source, 1).run(ii, mm).reshape(-1)
    spread = float(np.ptp(ref)) or 1.0
    root = logging.getLogger()
    try:
        for per_channel, float_nodes in _int8_ladder(source):
            was, root.disabled = root.disabled, True  # quantize_dynamic logs a pre-processing hint on the root logger
            try:
                quantize_dynamic(
                    str(source), str(tmp), weight_type=QuantType.QInt8, per_channel=per_channel,
                    nodes_to_exclude=float_nodes,
                )  # fmt: skip
            finally:
                root.disabled = was
            got = OnnxBackend(tmp, 1).run(ii, mm).reshape(-1)
            if np.all(np.isfinite(got)) and float(np.max(np.abs(got - ref))) <= 0.1 * spread:
                break
        else:
            raise CheckpointError(f"{target}: int8 scores differ too much from the float model ({got} vs {ref})")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    if out is not None:
        return target
    info = {
        "source_sha256": file_sha256(source),
        "int8_sha256": file_sha256(target),
        "weight_type": "QInt8",
        "per_channel": per_channel,
        "float_nodes": float_nodes,
    }
    (where / _INT8_SIDECAR).write_text(json.dumps(info, indent=2) + "\n")
    return target


# ---------------------------------------------------------------------------------------------------------
# Workloads and the default predictor


def score_workload(workload: Workload, scorer: Scorer, *, require_prompts: bool = False) -> Workload:
    """A copy of ``workload`` whose requests carry ``score = scorer.score(prompt)``.

    Requests without a prompt keep ``score=None`` (or raise, with ``require_prompts``).
    """
    specs = list(workload.requests)
    with_prompt = [i for i, s in enumerate(specs) if s.prompt is not None and s.prompt.strip()]
    if require_prompts and len(with_prompt) != len(specs):
        missing = next(s.request_id for i, s in enumerate(specs) if i not in set(with_prompt))
        raise ValueError(f"workload {workload.name!r}: request {missing!r} has no prompt to score")
    scores = scorer.score([specs[i].prompt or "" for i in with_prompt]) if with_prompt else np.empty(0)
    for i, s in zip(with_prompt, scores, strict=True):
        specs[i] = dataclasses.replace(specs[i], score=float(s))
    meta = {**workload.meta, "scorer": scorer.name or scorer.backend, "scored": len(with_prompt)}
    return dataclasses.replace(workload, requests=tuple(specs), meta=meta)


def ensure_predictor(
    name_or_path: str | Path | None = None,
    *,
    train_if_missing: bool = True,
    config: TrainConfig | None = None,
    log: Callable[[str], None] | None = print,
) -> Path:
    """Path of a usable checkpoint: ``name_or_path`` if it is a checkpoint directory, else
    ``~/.cache/headway/predictors/<name>`` (default :data:`DEFAULT_PREDICTOR_NAME`), trained there with
    ``config`` (default: the settings of ``headway predictor train``) when missing. A corrupt
    checkpoint raises :class:`CheckpointError`; it is never silently replaced or loaded."""
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir
    from headway.predict.model import read_checkpoint_meta, verify_checkpoint_files

    candidate = Path(name_or_path).expanduser() if name_or_path is not None else None
    if candidate is not None and (candidate.is_dir() or candidate.is_absolute() or len(candidate.parts) > 1):
        path = candidate
    else:
        path = default_predictor_dir(str(name_or_path or DEFAULT_PREDICTOR_NAME))
    if path.exists():
        verify_checkpoint_files(path, read_checkpoint_meta(path))
        return path
    if not train_if_missing:
        raise CheckpointError(f"{path}: no predictor checkpoint; run `headway predictor train --out {path}`")
    if log:
        log(f"no predictor at {path}; training one (headway predictor train defaults)")
    from headway.predict.train import train_predictor

    return train_predictor(config, out_dir=path, log=log).path


def default_scorer(
    backend: Backend = "torch",
    *,
    train_if_missing: bool = True,
    threads: int = 2,
    batch_size: int = 32,
    max_length: int | None = None,
) -> Scorer | ShippedPredictor:
    """The scorer the ``pars`` policy and the simulator use by default: the predictor trained into the
    cache by ``headway predictor train`` when there is one, else the one shipped in the package
    (:class:`~headway.predict.shipped.ShippedPredictor`, torch-free, on ONNX Runtime: its int8 copy for
    ``backend="onnx-int8"``, else the float graph).
    ``train_if_missing`` is kept for callers; nothing is trained at first start any more."""
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir

    if not default_predictor_dir(DEFAULT_PREDICTOR_NAME).exists():
        from headway.predict.shipped import ShippedPredictor

        int8 = backend == "onnx-int8"
        return ShippedPredictor(threads=threads, batch_size=batch_size, max_length=max_length, int8=int8)
    path = ensure_predictor(train_if_missing=train_if_missing)
    return Scorer.from_checkpoint(path, backend, threads=threads, batch_size=batch_size, max_length=max_length)
