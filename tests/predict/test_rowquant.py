"""int8 activations quantized per row (``headway.predict._rowquant``): exact against numpy, and a row's
result independent of the rows batched with it, where ONNX Runtime's per-tensor quantization is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from headway.predict._rowquant import ROWWISE_MARK, per_row_activations, quantize_rows  # noqa: E402

K, N = 16, 8


def _float_model(path: Path) -> np.ndarray:
    """x [B, T, K] @ w [K, N] + bias, then @ w2 [N, N]: two quantized MatMuls, one after an Add."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(K, N)).astype(np.float32)
    w2 = rng.normal(size=(N, N)).astype(np.float32)
    bias = rng.normal(size=N).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "bias"], ["hb"]),
            helper.make_node("MatMul", ["hb", "w2"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", N])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (w2, "w2"), (bias, "bias"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return bias


def _quantized(tmp_path: Path, per_channel: bool = False) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _float_model(src)
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    return out


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(["y"], {"x": x})[0])


def _reference(path: Path, x: np.ndarray) -> np.ndarray:
    """Per-row symmetric 7-bit activations (scale max|x| / 63 over the last axis) against the int8 weights
    quantize_dynamic stored, in float64."""
    weights = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}

    def qmatmul(a: np.ndarray, name: str) -> np.ndarray:
        scale = np.maximum(np.abs(a).max(axis=-1, keepdims=True), 1e-8) / 63.0
        codes = np.clip(np.round(a / scale), -64, 63)
        wq = weights[f"{name}_quantized"].astype(np.float64) - weights[f"{name}_zero_point"].astype(np.float64)
        return (codes @ wq) * weights[f"{name}_scale"].astype(np.float64) * scale

    h = qmatmul(x.astype(np.float64), "w") + weights["bias"]
    return qmatmul(h.astype(np.float32).astype(np.float64), "w2")


@pytest.mark.parametrize("per_channel", [False, True])
def test_rows_are_quantized_on_their_own_and_match_numpy(tmp_path: Path, per_channel: bool) -> None:
    (tmp_path / "plain").mkdir()
    plain = _quantized(tmp_path / "plain", per_channel)  # as quantize_dynamic leaves it
    path = _quantized(tmp_path, per_channel)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5, K)).astype(np.float32)
    x[1] *= 40.0  # one sample far larger than the others
    x[2, 0] = 0.0  # a row of zeros
    assert quantize_rows(path) == 2
    assert any(p.key == ROWWISE_MARK and p.value == "per_row" for p in onnx.load(str(path)).metadata_props)
    got = _run(path, x)
    ref = _reference(path, x)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    # each sample as its own batch: the same rows
    alone = np.concatenate([_run(path, x[i : i + 1]) for i in range(len(x))])
    assert np.allclose(alone, got, rtol=1e-6, atol=1e-6)
    # per tensor, the large sample's scale coarsened the first sample's rows in the batch
    assert not np.allclose(_run(plain, x[:1]), _run(plain, x)[:1], rtol=1e-3, atol=1e-3)


def test_an_unknown_use_of_a_quantized_activation_is_refused_untouched(tmp_path: Path) -> None:
    model = onnx.load(str(_quantized(tmp_path)))
    scale = next(n.output[1] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    model.graph.node.append(helper.make_node("Identity", [scale], ["leak"]))
    before = model.SerializeToString()
    with pytest.raises(ValueError, match="feeds a Identity, not a Mul"):
        per_row_activations(model)
    assert model.SerializeToString() == before
