"""`make gpu-check`: the paper path's GPU stages at real model size, without the hub or a dataset.

Builds Arc2Face's architecture with random weights (SD1.5 UNet, CLIP ViT-L/14 text encoder, SD1.5 VAE, from their
configs in ``models/arc2face.py`` and ``SD15_VAE`` below), a synthetic world of identity embeddings (clustered unit
vectors; the real selection stage picks the forget identities, splits and anchors), and runs for 2 forget identities
what the workflow's jobs run: unlearn (PIU at the paper's batch, ``--steps`` steps, projected to the run's steps),
evaluate before and after (the paper's 25 + 25 samples, 25 DPM-Solver++ steps, VAE decode, scoring), the light audit
(the default config's probes: leak, photo, neighbourhood) and the tables (metrics rows, summary, audit summary), in
bf16, once with ``torch.compile`` off and once on. Prints seconds per stage and writes
``results/benchmarks/gpu_<time>.json`` in the record format ``idunlearn.plan`` reads.

The face analyser is a stand-in (``ProjectionAnalyser``: the whole image as one face, a fixed random projection
as its embedding), since SCRFD and ArcFace come from the hub: the scoring seconds here leave out their ONNX passes.
``--tiny`` runs the same code with tiny shapes on a CPU (the test suite's check).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

from .audit.probes import probe_set
from .audit.run import audit_rows, score_probes
from .audit.tables import audit_summary, audit_table
from .audit.verification import calibrate
from .benchmarks import machine_info
from .config import deep_update, job_settings, run_config, validate_config
from .evaluation.aggregate import metrics_row, summarise
from .evaluation.features import RecognizerFeatures
from .evaluation.quality import build_quality
from .evaluation.run import evaluate_generator
from .evaluation.samples import evaluation_set
from .experiment import unlearning_data
from .faces.align import ALIGNED_SIZE, ARCFACE_TEMPLATE_112
from .faces.analyser import Detection, FaceAnalyser, FaceStatus
from .identities import identity_centroids
from .io import write_json
from .models.arc2face import clip_vit_l14_text_config, sd15_scheduler_config, sd15_unet_config
from .models.conditioning import IdentityTextEncoder
from .models.generator import IdentityGenerator
from .selection import select_experiments
from .unlearning import build_method
from .unlearning.runner import unlearn

# SD1.5's vae/config.json (AutoencoderKL, 83.65M parameters): 512 px images from 64 x 64 x 4 latents.
SD15_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4, "block_out_channels": (128, 256, 512, 512),
            "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
            "layers_per_block": 2, "act_fn": "silu", "norm_num_groups": 32, "sample_size": 512,
            "scaling_factor": 0.18215}

# Model shapes: paper = Arc2Face's real sizes; tiny = the same block layout at a CPU's size (64 px images).
SHAPES = {
    "paper": {"unet": {}, "text": {}, "vae": {}, "latent_size": 64, "run": {}, "evaluation": {}, "probes": {}},
    "tiny": {"unet": {"block_out_channels": (32, 64, 128, 128), "layers_per_block": 1},
             "text": {"num_hidden_layers": 1, "intermediate_size": 256, "vocab_size": 49408},
             "vae": {"block_out_channels": (32, 32, 64, 64), "layers_per_block": 1, "sample_size": 64},
             "latent_size": 8, "run": {"forget_batch": 2, "retain_batch": 2},
             "evaluation": {"n_forget_samples": 4, "n_retain_samples": 4, "steps": 2},
             "probes": {"leak": {"conditions": 2, "seeds": 2, "ks": [1, 2]},
                        "neighbourhood": {"cosines": [1.0, 0.5], "retain_directions": 1, "random_directions": 1}}},
}
CONFIGS = ("config/config.yaml", "config/celebahq.yaml")  # merged as the workflow merges them
LIGHT_AUDIT_CONFIG = "config/config.yaml"  # the default run's light audit probes
N_IDENTITIES = 2


def build_generator(shapes: str, device: str, seed: int = 0) -> IdentityGenerator:
    """Arc2Face's architecture (or its tiny shape) with random weights, built on ``device``."""
    shape = SHAPES[shapes]
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        text = CLIPTextModel(CLIPTextConfig(**{**clip_vit_l14_text_config().to_dict(), **shape["text"]}))
        unet = UNet2DConditionModel(**{**sd15_unet_config(), **shape["unet"], "sample_size": shape["latent_size"]})
        vae = AutoencoderKL(**{**SD15_VAE, **shape["vae"]})
    for frozen in (text, vae):  # only UNet parameters are ever trained
        frozen.requires_grad_(False).eval()
    return IdentityGenerator(IdentityTextEncoder(text.eval()), unet.eval(), sd15_scheduler_config(), vae=vae,
                             vae_scale=SD15_VAE["scaling_factor"]).to(device)


class ProjectionAnalyser(FaceAnalyser):
    """Stand-in face analyser: the centre square as the one face (five landmarks where ArcFace's template puts
    them), its embedding a fixed random projection of the aligned crop, L2-normalised."""

    name = "projection-stand-in"

    def __init__(self, dim: int = 512, seed: int = 0):
        super().__init__(min_image_size=16, min_face_size=8)
        self.embedding_dim = dim
        self.projection = np.random.default_rng(seed).standard_normal((16 * 16 * 3, dim)).astype(np.float32)

    def detect(self, image: np.ndarray) -> list[Detection]:
        size = min(image.shape[:2])
        return [Detection(np.array([0, 0, size, size], np.float32), 0.9, ARCFACE_TEMPLATE_112 * size / ALIGNED_SIZE)]

    def embed(self, faces: np.ndarray) -> np.ndarray:
        small = torch.nn.functional.interpolate(torch.as_tensor(faces).permute(0, 3, 1, 2).float(), size=(16, 16),
                                                mode="area").flatten(1).numpy() / 255.0 - 0.5
        out = small @ self.projection
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def synthetic_world(n_identities: int, images: int, dim: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Faces (image_id, status, embedding) and labels (image_id, identity): ``images`` noisy unit vectors around
    each of ``n_identities`` random identity directions, as the identity stage would have found them."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_identities, dim))
    emb = np.repeat(centres, images, axis=0) + 0.6 * rng.standard_normal((n_identities * images, dim))
    emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
    ids = [f"img{i:05d}" for i in range(len(emb))]
    faces = pd.DataFrame({"image_id": ids, "status": FaceStatus.OK.value, "embedding": list(emb)})
    labels = pd.DataFrame({"image_id": ids, "identity": np.repeat(np.arange(n_identities), images)})
    return faces, labels


def check_config(root: Path, shapes: str, steps: int) -> dict:
    """The paper config as the workflow merges it, with the check's changes: bf16, ``steps`` PIU steps, 2 forget
    identities, KD features from the stand-in recognizer (DINOv2 is a hub model), the default run's light audit;
    tiny shapes also take tiny batches and a tiny evaluation (SHAPES)."""
    import yaml

    merged: dict = {}
    for name in CONFIGS:
        merged = deep_update(merged, yaml.safe_load((root / name).read_text()))
    light = yaml.safe_load((root / LIGHT_AUDIT_CONFIG).read_text())["audit"]["probes"]
    shape = SHAPES[shapes]
    merged = deep_update(merged, {
        "selection": {"n_forget": N_IDENTITIES},
        "unlearning": {"runs": {"piu": {"precision": "bf16", **shape["run"]}}},
        "evaluation": {"kd": {"features": "recognizer"}, "quality": {"ediffiqa_onnx": None}, **shape["evaluation"]}})
    merged["audit"]["probes"] = deep_update(light, shape["probes"])
    config = validate_config(merged)
    config["check"] = {"steps": steps, "projected_steps": run_config(config, "piu")["steps"]}
    return config


@contextmanager
def timed(seconds: dict, key: str):
    tick = time.perf_counter()
    yield
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - tick


def run_check(shapes: str, device: str, compile_modes=(False, True), steps: int = 10, root: Path = Path("."),
              seed: int = 0) -> dict:
    """Every stage for N_IDENTITIES identities per compile mode; returns the record (seconds per stage)."""
    config = check_config(root, shapes, steps)
    run = {**job_settings(run_config(config, "piu")), "steps": steps, "checkpoint_every": steps}
    faces, labels = synthetic_world(40, 8, 512, seed)
    centroids = identity_centroids(np.stack(faces["embedding"]), labels["identity"].to_numpy())
    selections = [s.to_dict() for s in select_experiments(labels, centroids, config["selection"], seed)]
    analyser = ProjectionAnalyser(seed=seed)
    features, quality = RecognizerFeatures(analyser), build_quality(config["evaluation"]["quality"])
    tau = calibrate(np.stack(faces["embedding"]), labels["identity"].to_numpy(),
                    **{k: config["audit"]["verification"][k] for k in ("far", "heldout_fraction")}, seed=seed)["tau"]
    reference_images = np.random.default_rng(seed).integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
    reference = features(reference_images)
    evaluation_cfg, probes = config["evaluation"], config["audit"]["probes"]
    modes = {}
    for compile_mode in compile_modes:
        seconds: dict[str, float] = {}
        if torch.device(device).type == "cuda":  # each mode's own peak
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        with timed(seconds, "load"):
            generator = build_generator(shapes, device, seed)
            original = {k: v.detach().clone() for k, v in generator.unet.state_dict().items()}
            if compile_mode:
                generator.unet.compile()
        metrics, audits = [], []
        for selection in selections:
            generator.unet.load_state_dict(original)
            eval_set = evaluation_set(selection, faces, labels, evaluation_cfg["n_forget_samples"],
                                      evaluation_cfg["n_retain_samples"], seed)
            args = (analyser, features, quality, eval_set, centroids, selection["anchor_identity"], reference,
                    evaluation_cfg)
            with timed(seconds, "evaluate"):
                before, before_metrics, _ = evaluate_generator(generator, *args)
            with timed(seconds, "unlearn"), tempfile.TemporaryDirectory() as state:
                data = unlearning_data(selection, faces, labels, centroids)
                _, timings = unlearn(generator, build_method(run["method"], run), data, run,
                                     Path(state) / "resume_state.pt", seed)
            with timed(seconds, "evaluate"):
                after, after_metrics, _ = evaluate_generator(generator, *args)
            with timed(seconds, "audit"):
                scored, _ = score_probes(generator, analyser, probe_set(selection, faces, centroids, probes, seed),
                                         centroids, evaluation_cfg)
                audits.append(("piu", selection["forget_identity"],
                               audit_rows(scored, after, before, centroids, selection["forget_identity"], tau,
                                          probes["leak"]["ks"])))
            metrics.append(metrics_row("piu", run, {"forget_identity": selection["forget_identity"]},
                                       before_metrics, after_metrics,
                                       [k for k, v in before_metrics.items() if isinstance(v, (int, float))]))
            print(f"{'compile' if compile_mode else 'eager'}: identity {selection['forget_identity']} done; "
                  + ", ".join(f"{stage} {s:.1f} s" for stage, s in seconds.items()), flush=True)
        with timed(seconds, "tables"):
            table = pd.DataFrame(metrics)
            summarise(table, ["run"], [c for c in table if c.endswith(("_before", "_after", "_delta"))])
            audit_summary(audit_table(audits), seed)
        modes["compile" if compile_mode else "eager"] = {
            "seconds": seconds, "unlearn_seconds_per_step": seconds["unlearn"] / (steps * len(selections)),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.device(device).type == "cuda" else None}
        del generator, original
    return record(config, shapes, device, modes, steps)


def record(config: dict, shapes: str, device: str, modes: dict, steps: int) -> dict:
    """The check's result in the benchmark-record format ``idunlearn.plan`` reads (its eager numbers are the
    workflow's: the jobs do not compile); per job = per identity, the first load counted once per job."""
    eager = modes.get("eager") or next(iter(modes.values()))
    n = N_IDENTITIES
    ev = config["evaluation"]
    run = run_config(config, "piu")
    measurements = [
        {"stage": "unlearn", "precision": "bf16", "compile": "eager" not in modes,
         "seconds_per_step": eager["unlearn_seconds_per_step"], "load_seconds": eager["seconds"]["load"],
         "reference": {"steps": run["steps"], "forget_batch": run["forget_batch"], "retain_batch": run["retain_batch"],
                       "regime": run["regime"]},
         "what": f"{steps} PIU steps per identity timed (optimiser state included), projected linearly"},
        # sampling runs the generator's fp32 weights, as the workflow's evaluation and audit jobs do
        {"stage": "evaluate", "precision": "fp32", "compile": "eager" not in modes,
         "seconds_per_job": eager["seconds"]["evaluate"] / (2 * n) + eager["seconds"]["load"],
         "reference": {k: ev[k] for k in ("n_forget_samples", "n_retain_samples", "steps")},
         "what": "one evaluation (samples, VAE decode, stand-in scoring) plus one model load"},
        {"stage": "audit", "precision": "fp32", "compile": "eager" not in modes,
         "seconds_per_job": eager["seconds"]["audit"] / n + eager["seconds"]["load"],
         "reference": {"probes": sorted(config["audit"]["probes"])},
         "what": "one light-audit job's probe samples (stand-in scoring) plus one model load"},
    ]
    return {"label": f"make gpu-check ({shapes} shapes) on {machine_info(device)['device_name']}",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "shapes": shapes,
            "device": device, "gpu": machine_info(device)["device_name"], "machine": machine_info(device),
            "command": shlex.join(sys.orig_argv), "identities": n, "timed_steps": steps, "modes": modes,
            "measurements": measurements}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="idunlearn.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU in seconds) instead of Arc2Face's")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--steps", type=int, default=10, help="PIU steps timed per identity")
    passes = parser.add_mutually_exclusive_group()
    passes.add_argument("--no-compile", action="store_true", help="only the eager pass (torch.compile off)")
    # compilation's first-call cost is unknown on a new GPU: a separate run keeps the eager record if it runs long
    passes.add_argument("--compile-only", action="store_true", help="only the torch.compile pass")
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON path (default results/benchmarks/gpu_<time>.json; --tiny: gpu_tiny_<time>.json)")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shapes = "tiny" if args.tiny else "paper"
    if shapes == "paper" and torch.device(device).type != "cuda":
        sys.exit("gpu-check: the real model size needs a GPU (about 4 GB of weights, minutes per step on a CPU); "
                 "use --tiny on a CPU")
    modes = (False,) if args.no_compile else (True,) if args.compile_only else (False, True)
    result = run_check(shapes, device, modes, args.steps)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    output = args.output or Path("results/benchmarks") / f"gpu_{'tiny_' if args.tiny else ''}{stamp}.json"
    write_json(result, output)
    for mode, entry in result["modes"].items():
        print(f"{mode}: " + ", ".join(f"{stage} {s:.1f} s" for stage, s in entry["seconds"].items())
              + f"; {entry['unlearn_seconds_per_step']:.3f} s per PIU step")
    print(f"-> {output}")
    return output


if __name__ == "__main__":
    main()
