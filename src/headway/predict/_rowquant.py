"""int8 scoring whose results do not depend on the batch: activations quantized per row.

ONNX Runtime's ``quantize_dynamic`` quantizes the input of each integer MatMul with one scale and zero
point for the whole tensor (``DynamicQuantizeLinear``): every prompt of a batch, padding included,
shares them, so a prompt's score moved with the prompts scored beside it. :func:`per_row_activations`
rewrites each ``DynamicQuantizeLinear`` into a symmetric quantization of each row (one token's
activations): scale ``max|x| / 63`` over the last axis, codes ``round(x / scale) + 64`` in ``1..127``
(ONNX Runtime's per-axis ``QuantizeLinear`` over the rows), so the zero point is one constant (ONNX
Runtime's ``MatMulInteger`` on CPU takes a single zero point for its first input).

Seven bits, not eight: on x86 CPUs without VNNI, ONNX Runtime multiplies uint8 activations by int8
weights two at a time into int16 and saturates (``vpmaddubsw``): with codes up to 255 and weights at
+-127 a pair can overflow, so results depended on the CPU's instruction set. With codes up to 127 no
pair can overflow (2 x 127 x 128 < 32,768). What it costs and gains: docs/length-predictor.md.

The row's scale multiplies the MatMul's float output after the weight's scale, in a node of its own:
ONNX Runtime fuses ``MatMulInteger -> Cast -> Mul`` into one op whose activation scale is one per
tensor, and a per-row scale in that product came out wrong. A prompt's scores then depend on its own
tokens only, as with the float graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ROWWISE_MARK", "per_row_activations", "quantize_rows"]

ROWWISE_MARK = "headway.int8_activations"
"""Metadata key (``per_row``) a rewritten model carries, so a cached per-tensor model is told apart."""

_CONSTANTS = {"eps": 1e-8, "levels": 63.0}
_ZERO_POINT = 64


def _consumers(graph: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def per_row_activations(model: Any) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto`` from ``quantize_dynamic``) in place to quantize its
    integer MatMuls' activations per row; returns how many quantizations were rewritten. ValueError,
    with nothing changed, when a quantized activation is used in a way this rewrite does not know
    (each scale must feed only ``Mul(scale, weight scale)`` nodes whose outputs feed only ``Mul``
    nodes, each zero point only ``MatMulInteger`` nodes)."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    users = _consumers(graph)
    scaled: dict[int, Any] = {}  # id(final Mul) -> the Mul by the row scale to insert after it
    dead: set[int] = set()  # the Mul(activation scale, weight scale) nodes, no longer used
    found = 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            continue
        found += 1
        _, scale, zero = node.output
        if any(u.op_type != "MatMulInteger" for u in users.get(zero, [])):
            raise ValueError(f"per_row_activations: zero point {zero!r} is used beyond MatMulInteger")
        for product in users.get(scale, []):
            if product.op_type != "Mul":
                raise ValueError(f"per_row_activations: scale {scale!r} feeds a {product.op_type}, not a Mul")
            weight_scale = next(i for i in product.input if i != scale)
            for final in users.get(product.output[0], []):
                if final.op_type != "Mul" or id(final) in scaled:
                    raise ValueError(f"per_row_activations: {product.output[0]!r} feeds a {final.op_type}")
                scaled[id(final)] = (final, product.output[0], weight_scale, scale)
            dead.add(id(product))
    if not found:
        return 0
    names = {k: f"headway_rowq_{k}" for k in _CONSTANTS}
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.float32), names[k]) for k, v in _CONSTANTS.items())
    graph.initializer.append(numpy_helper.from_array(np.array(_ZERO_POINT, np.uint8), "headway_rowq_zero"))
    graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "headway_rowq_flat"))
    nodes: list[Any] = []
    for node in graph.node:
        if id(node) in dead:
            continue
        if node.op_type == "DynamicQuantizeLinear":
            x, (codes, scale, zero) = node.input[0], node.output
            p = f"{x}_rowq"
            # each row's scale, then ONNX Runtime's own per-axis QuantizeLinear over the rows laid out
            # in two dimensions (one fused pass, rounding half to even; codes stay in 1..127)
            nodes += [
                helper.make_node("Abs", [x], [f"{p}_abs"]),
                helper.make_node("ReduceMax", [f"{p}_abs"], [f"{p}_max"], axes=[-1], keepdims=1),
                helper.make_node("Max", [f"{p}_max", names["eps"]], [f"{p}_top"]),
                helper.make_node("Div", [f"{p}_top", names["levels"]], [scale]),
                helper.make_node("Reshape", [scale, "headway_rowq_flat"], [f"{p}_scales"]),
                helper.make_node("Shape", [f"{p}_scales"], [f"{p}_rows"]),
                helper.make_node("Expand", ["headway_rowq_zero", f"{p}_rows"], [f"{p}_zeros"]),
                helper.make_node("Flatten", [x], [f"{p}_2d"], axis=-1),
                helper.make_node("QuantizeLinear", [f"{p}_2d", f"{p}_scales", f"{p}_zeros"], [f"{p}_q2d"], axis=0),
                helper.make_node("Shape", [x], [f"{p}_shape"]),
                helper.make_node("Reshape", [f"{p}_q2d", f"{p}_shape"], [codes]),
                helper.make_node("Identity", ["headway_rowq_zero"], [zero]),
            ]
            continue
        nodes.append(node)
        entry = scaled.get(id(node))
        if entry is not None:
            final, product, weight_scale, scale = entry
            out = final.output[0]
            final.input[list(final.input).index(product)] = weight_scale
            final.output[0] = f"{out}_wscaled"
            nodes.append(helper.make_node("Mul", [f"{out}_wscaled", scale], [out]))
    del graph.node[:]
    graph.node.extend(nodes)
    helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, ROWWISE_MARK: "per_row"})
    return found


def quantize_rows(path: str | Path) -> int:
    """:func:`per_row_activations` on the model file ``path``, rewritten in place (checked first)."""
    import onnx

    model = onnx.load(str(path))
    count = per_row_activations(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return count
