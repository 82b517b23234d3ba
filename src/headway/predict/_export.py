"""ONNX exports of a checkpoint: ``model.onnx`` and its int8 copy, checked against the source model,
with where they live (the checkpoint, or a cache directory when it is read-only)."""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from pathlib import Path

import numpy as np

from headway.predict._backends import Backend, OnnxBackend
from headway.predict._errors import CheckpointError
from headway.predict._paths import default_cache_dir, file_sha256, set_offline

__all__ = ["MIN_OPSET", "ONNX_FILE", "ONNX_INT8_FILE", "derived_dir", "export_onnx", "quantize_onnx"]

ONNX_FILE = "model.onnx"
_ONNX_SIDECAR = "model.onnx.json"
ONNX_INT8_FILE = "model.int8.onnx"
_INT8_SIDECAR = "model.int8.onnx.json"


def _derived_problem(
    path: Path,
    sidecar: Path,
    what: str,
    source: tuple[str, str | None],
    own_key: str,
    stale: str,
    made: tuple[str, str, str] | None = None,
) -> str | None:
    """Why ``path``, a file derived from a checkpoint and described by the JSON ``sidecar``, cannot be
    used (missing; made from another ``source`` = (sidecar key, current hash); its hash, under
    ``own_key``, no longer matches; or ``made`` = (sidecar key, value, why not) says it was made
    another way); None if it can."""
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
    if made is not None and info.get(made[0]) != made[1]:
        return made[2]
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
    per_row = ("activations", "per_row", "stale int8 model (its activations are quantized per batch, not per row)")
    return _derived_problem(path, ckpt / _INT8_SIDECAR, "int8 ONNX model", source, "int8_sha256", stale, per_row)


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
    ``model.int8.onnx`` (ONNX Runtime's ``quantize_dynamic``, activations then quantized per row by
    :func:`~headway.predict._rowquant.per_row_activations`), both in ``into`` (default
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

    from headway.predict._rowquant import quantize_rows
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
            quantize_rows(tmp)
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
        "activations": "per_row",
        "per_channel": per_channel,
        "float_nodes": float_nodes,
    }
    (where / _INT8_SIDECAR).write_text(json.dumps(info, indent=2) + "\n")
    return target


# ---------------------------------------------------------------------------------------------------------
# Workloads and the default predictor
