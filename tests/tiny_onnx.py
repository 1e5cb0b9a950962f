"""A tiny ONNX model built locally in place of a downloaded one: per-channel global mean of an N x 3 x 112 x 112
input, then a matrix product, so that its output is computable by hand."""

from __future__ import annotations

import numpy as np


def pooled_linear_onnx(path, weight: np.ndarray, input_name: str, output_name: str, graph_name: str,
                       batch: int | str = "N") -> None:
    """Save to ``path`` the model input (N, 3, 112, 112) -> mean over pixels (N, 3) @ ``weight`` (3, K); ``batch``
    an int fixes N in the input and output shapes (a fixed-batch export)."""
    from onnx import TensorProto, helper, numpy_helper, save

    weight = np.asarray(weight, np.float32)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "weight"], [output_name])],
        graph_name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, 3, 112, 112])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch, weight.shape[1]])],
        [numpy_helper.from_array(weight, "weight")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
