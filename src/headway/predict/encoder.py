"""Torch-free prompt embeddings: the bundled MiniLM encoder as an ONNX graph, run by ONNX Runtime.

:func:`build_encoder_onnx` writes the ONNX graph of a BERT encoder with mean pooling straight from its
``model.safetensors`` (numpy arrays, no torch, no export step), so a scoring-only install needs just
``onnxruntime``, ``onnx``, ``safetensors``, ``tokenizers`` and numpy. :class:`OnnxEncoder` tokenizes with
the encoder's own ``tokenizer.json`` and returns one pooled vector per prompt; the shipped predictor,
cross-source evaluation and the online learner all score these vectors with a :class:`RidgeHead`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from headway._optional import MissingExtraError, install_hint
from headway.predict._chunks import _padding_chunks
from headway.predict._errors import EncoderError

__all__ = ["DEFAULT_EMBED_LENGTH", "POOLINGS", "OnnxEncoder", "build_encoder_onnx", "encoder_onnx_path"]

DEFAULT_EMBED_LENGTH = 128
"""Prompt tokens the encoder reads (with [CLS] and [SEP]); longer prompts are cut."""

_OPSET = 17


def _weights(model_dir: Path) -> dict[str, npt.NDArray[Any]]:
    from safetensors.numpy import load_file

    path = model_dir / "model.safetensors"
    if not path.is_file():
        raise EncoderError(f"{model_dir}: no model.safetensors")
    raw = load_file(str(path))
    return {k.removeprefix("bert."): v for k, v in raw.items()}


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EncoderError(f"{model_dir}: unreadable config.json ({exc})") from None
    if cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu":
        raise EncoderError(f"{model_dir}: only BERT encoders with GELU are built without torch")
    return cast(dict[str, Any], cfg)


POOLINGS = ("mean", "cls", "pooler")


def build_encoder_onnx(
    model_dir: str | Path,
    out: str | Path,
    *,
    weights: dict[str, npt.NDArray[Any]] | None = None,
    pooling: str = "mean",
    num_layers: int | None = None,
) -> Path:
    """Write ``out``: inputs ``input_ids``, ``attention_mask`` (int64, ``[batch, tokens]``), output
    ``embedding`` (float32 ``[batch, hidden]``): with ``pooling="mean"`` the attention-masked mean of
    the last layer, ``"cls"`` its first token, ``"pooler"`` BERT's pooler (tanh of a dense layer on
    the first token). ``weights`` (names as in ``model.safetensors``) replace the directory's.
    ``num_layers``: only the encoder's first layers (None: all); EncoderError when it has fewer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    src = Path(model_dir)
    cfg = _config(src)
    w = _weights(src) if weights is None else weights
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    head_dim = hidden // heads
    inits: list[Any] = []
    nodes: list[Any] = []
    count = [0]

    def const(name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(kind: str, inputs: Sequence[str], **attrs: Any) -> str:
        count[0] += 1
        name = f"{kind.lower()}_{count[0]}"
        nodes.append(helper.make_node(kind, list(inputs), [name], **attrs))
        return name

    def linear(x: str, prefix: str) -> str:
        wt = const(f"{prefix}.wT", w[f"{prefix}.weight"].T.copy())
        return op("Add", [op("MatMul", [x, wt]), const(f"{prefix}.b", w[f"{prefix}.bias"])])

    def norm(x: str, prefix: str) -> str:
        g, b = const(f"{prefix}.g", w[f"{prefix}.weight"]), const(f"{prefix}.b", w[f"{prefix}.bias"])
        return op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    ids, mask = "input_ids", "attention_mask"
    seq = op("Squeeze", [op("Shape", [ids], start=1, end=2), const("axis0", [0], np.int64)])
    positions = op("Range", [const("zero", 0, np.int64), seq, const("one", 1, np.int64)])
    x = op("Gather", [const("word", w["embeddings.word_embeddings.weight"]), ids])
    x = op("Add", [x, op("Gather", [const("pos", w["embeddings.position_embeddings.weight"]), positions])])
    x = op("Add", [x, const("type0", w["embeddings.token_type_embeddings.weight"][0])])
    x = norm(x, "embeddings.LayerNorm")
    maskf = op("Cast", [mask], to=TensorProto.FLOAT)
    bias = op("Mul", [op("Sub", [const("f1", 1.0), maskf]), const("neg", -1e4)])
    bias = op("Unsqueeze", [bias, const("axes12", [1, 2], np.int64)])
    split = const("split_shape", [0, 0, heads, head_dim], np.int64)
    merge = const("merge_shape", [0, 0, hidden], np.int64)
    scale = const("scale", 1.0 / math.sqrt(head_dim))
    layer = 0
    while layer != num_layers and f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}"
        q = op("Transpose", [op("Reshape", [linear(x, f"{p}.attention.self.query"), split])], perm=[0, 2, 1, 3])
        k = op("Transpose", [op("Reshape", [linear(x, f"{p}.attention.self.key"), split])], perm=[0, 2, 3, 1])
        v = op("Transpose", [op("Reshape", [linear(x, f"{p}.attention.self.value"), split])], perm=[0, 2, 1, 3])
        att = op("Softmax", [op("Add", [op("Mul", [op("MatMul", [q, k]), scale]), bias])], axis=-1)
        ctx = op("Reshape", [op("Transpose", [op("MatMul", [att, v])], perm=[0, 2, 1, 3]), merge])
        x = norm(op("Add", [x, linear(ctx, f"{p}.attention.output.dense")]), f"{p}.attention.output.LayerNorm")
        h = linear(x, f"{p}.intermediate.dense")
        erf = op("Erf", [op("Mul", [h, const(f"{p}.rsqrt2", 1 / math.sqrt(2.0))])])
        h = op("Mul", [op("Mul", [h, op("Add", [erf, const(f"{p}.one", 1.0)])]), const(f"{p}.half", 0.5)])
        x = norm(op("Add", [x, linear(h, f"{p}.output.dense")]), f"{p}.output.LayerNorm")
        layer += 1
    if layer == 0:
        raise EncoderError(f"{src}: no encoder layers in model.safetensors")
    if num_layers is not None and layer != num_layers:
        raise EncoderError(f"{src}: {num_layers} encoder layers asked for, the weights have {layer}")
    if pooling == "mean":
        m3 = op("Unsqueeze", [maskf, const("axes2", [2], np.int64)])
        axes1 = const("axes1", [1], np.int64)
        total = op("ReduceSum", [op("Mul", [x, m3]), axes1], keepdims=0)
        n = op("Max", [op("ReduceSum", [m3, axes1], keepdims=0), const("f1b", 1.0)])
        nodes.append(helper.make_node("Div", [total, n], ["embedding"]))
    else:
        first = op("Gather", [x, const("index0", 0, np.int64)], axis=1)
        if pooling == "cls":
            nodes.append(helper.make_node("Identity", [first], ["embedding"]))
        else:
            if "pooler.dense.weight" not in w:
                raise EncoderError(f"{src}: pooling 'pooler' but the weights have no pooler")
            nodes.append(helper.make_node("Tanh", [linear(first, "pooler.dense")], ["embedding"]))
    graph = helper.make_graph(
        nodes,
        "headway_encoder",
        [
            helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="headway")
    model.ir_version = 8
    onnx.checker.check_model(model)
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    onnx.save_model(model, str(tmp))
    tmp.replace(dst)
    return dst


def encoder_onnx_path(model_dir: str | Path, variant: str = "mean") -> Path:
    """Where the ONNX graph of ``model_dir`` is cached (``$HEADWAY_CACHE_DIR/derived/``), keyed by the
    encoder's path, weights size and mtime, and ``variant`` (pooling, and any weights applied)."""
    from headway.predict._paths import default_cache_dir

    src = Path(model_dir).resolve()
    st = (src / "model.safetensors").stat()
    stamp = f"{src}|{st.st_size}|{st.st_mtime_ns}|opset{_OPSET}|{variant}"
    tag = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return default_cache_dir() / "derived" / f"encoder-{tag}.onnx"


class OnnxEncoder:
    """Pooled prompt embeddings from an encoder directory (default: the bundled MiniLM-L6) on ONNX Runtime.

    The graph is built on first use and cached; ``threads`` sets ONNX Runtime's intra-op threads.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        max_length: int = DEFAULT_EMBED_LENGTH,
        threads: int = 2,
        batch_size: int = 32,
        graph: str | Path | None = None,
    ) -> None:
        """``graph``: an ONNX file from :func:`build_encoder_onnx` for ``model_dir`` (default: its
        mean-pooled graph, built on first use)."""
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if threads < 1 or batch_size < 1:
            raise ValueError(f"threads and batch_size must be >= 1, got {threads} and {batch_size}")
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
            raise MissingExtraError(f"scoring needs {exc.name}: {install_hint('score')}", name=exc.name) from exc
        from headway.predict._paths import default_encoder_path

        self.model_dir = Path(model_dir) if model_dir is not None else default_encoder_path()
        if not (self.model_dir / "tokenizer.json").is_file():
            raise EncoderError(f"{self.model_dir}: no tokenizer.json")
        cfg = _config(self.model_dir)
        self.max_length = min(max_length, int(cfg.get("max_position_embeddings", 512)))
        self.hidden_size = int(cfg["hidden_size"])
        self.batch_size = batch_size
        path = Path(graph) if graph is not None else encoder_onnx_path(self.model_dir)
        if graph is None and not path.is_file():
            build_encoder_onnx(self.model_dir, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(self.max_length)
        self._tokenizer = tok

    def token_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(list(prompts))]

    def embed(self, prompts: Sequence[str]) -> npt.NDArray[np.float32]:
        """``(len(prompts), hidden)`` float32: one mean-pooled vector per prompt. Prompts are sorted by
        token count and run in batches of at most ``batch_size``, each padded to its longest, split
        where that runs the fewest tokens (:func:`~headway.predict._chunks._padding_chunks`, as
        :class:`~headway.predict.score.Scorer` does)."""
        out = np.zeros((len(prompts), self.hidden_size), dtype=np.float32)
        if not prompts:
            return out
        ids = self.token_ids(prompts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for a, b in _padding_chunks([len(ids[i]) for i in order], self.batch_size):
            rows = order[a:b]
            width = max(len(ids[r]) for r in rows)
            input_ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for j, r in enumerate(rows):
                input_ids[j, : len(ids[r])] = ids[r]
                mask[j, : len(ids[r])] = 1
            (emb,) = self._session.run(["embedding"], {"input_ids": input_ids, "attention_mask": mask})
            out[rows] = emb
        return out
