"""The paper path's downloads: one `hf download` command per hub artefact, at the revisions the loaders pin.

The list is built from the constants the loading code itself reads (repository, revision, file names), and from the
paper config (the dataset's repo, revision and split; where eDifFIQA goes), so a command cannot name another revision
than the one a run will ask the cache for. Each command names its files one by one: the shards of the dataset, whose
names carry a hash, by the loader's own pattern. docs/paper-setup.md shows ``download_block``; a test checks the
page against it and checks that the files named here are exactly those the stand-in hub (tests/paper_hub.py) lays
out and the loaders read.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from .evaluation.features import DINOV2_REPO, DINOV2_REVISION
from .evaluation.quality import EDIFFIQA_ONNX
from .faces.insightface_backend import (ARC2FACE_REPO, ARC2FACE_REVISION, DETECTOR_FILE, DETECTOR_REPO,
                                        DETECTOR_REVISION, RECOGNIZER_FILE)
from .models.arc2face import SD15_REPO, SD15_REVISION

HF = ".venv/bin/hf"  # huggingface_hub's CLI (`huggingface-cli download` was removed in huggingface_hub 1.0)
# The OpenCV model zoo's own hub copy of eDifFIQA(T); the code pins no revision of it (the file is read from a path).
EDIFFIQA_REPO = "opencv/face_image_quality_assessment_ediffiqa"

# What diffusers and transformers read from a model folder: its config and its weights in the format the hub holds.
_DIFFUSERS = ("config.json", "diffusion_pytorch_model.safetensors")
_SD15_TOKENIZER = ("merges.txt", "special_tokens_map.json", "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class HubDownload:
    what: str  # what the paper path uses it for
    repo: str
    revision: str | None  # None: the code pins no revision
    files: tuple[str, ...] = ()  # files in the repository, by name
    include: tuple[str, ...] = ()  # glob patterns, for files whose names are not known in advance
    repo_type: str = "model"
    local_dir: str | None = None  # None: into the Hugging Face cache (HF_HOME), where the loaders look

    def command(self) -> str:
        words = [HF, "download", self.repo, *self.files]
        if self.repo_type != "model":
            words += ["--repo-type", self.repo_type]
        if self.revision:
            words += ["--revision", self.revision]
        for pattern in self.include:
            words += ["--include", pattern]
        if self.local_dir:
            words += ["--local-dir", self.local_dir]
        return shlex.join(words)


def paper_downloads(config: dict) -> list[HubDownload]:
    """The hub artefacts of a paper config (``config/celebahq.yaml`` merged over the defaults, or read alone)."""
    dataset = config["dataset"]["celebahq"]
    kd = config.get("evaluation", {}).get("kd", {})
    quality = config.get("evaluation", {}).get("quality", {}).get("ediffiqa_onnx")
    downloads = [
        HubDownload("CelebA-HQ, the train split's Parquet shards", dataset["repo"], dataset["revision"],
                    include=(f"data/{dataset['split']}-*.parquet",), repo_type="dataset"),
        HubDownload("Arc2Face: its UNet, its identity encoder and the ArcFace recognizer", ARC2FACE_REPO,
                    ARC2FACE_REVISION, files=(*(f"arc2face/{name}" for name in _DIFFUSERS), "encoder/config.json",
                                              "encoder/pytorch_model.bin", RECOGNIZER_FILE)),
        HubDownload("Stable Diffusion 1.5: the VAE, the noise schedule and the tokenizer", SD15_REPO, SD15_REVISION,
                    files=(*(f"vae/{name}" for name in _DIFFUSERS), "scheduler/scheduler_config.json",
                           *(f"tokenizer/{name}" for name in _SD15_TOKENIZER))),
        HubDownload("antelopev2's SCRFD face detector", DETECTOR_REPO, DETECTOR_REVISION, files=(DETECTOR_FILE,)),
        HubDownload("DINOv2 ViT-L/14 for the kernel distance", DINOV2_REPO,
                    kd.get("dinov2_revision") or DINOV2_REVISION, files=("config.json", "model.safetensors")),
    ]
    if quality:
        path = PurePosixPath(quality)
        if path.name != EDIFFIQA_ONNX:
            raise ValueError(f"evaluation.quality.ediffiqa_onnx: {quality} is not named {EDIFFIQA_ONNX}, the name "
                             "the download gives; name the file so, or download it by hand")
        downloads.append(HubDownload("eDifFIQA(T) for face quality (no revision pinned)", EDIFFIQA_REPO, None,
                                     files=(EDIFFIQA_ONNX,), local_dir=str(path.parent)))
    return downloads


def download_commands(config: dict) -> list[str]:
    return [download.command() for download in paper_downloads(config)]


def download_block(config: dict) -> str:
    """The shell block docs/paper-setup.md shows: each command under a comment saying what it fetches."""
    return "\n".join(f"# {download.what}\n{download.command()}" for download in paper_downloads(config))
