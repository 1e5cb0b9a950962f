"""Trajectory probe (forgetting audit, part 6): a real image of the person, noised to timestep t by the forward process
and denoised by the model under that image's own identity condition. Unlearning that only blocks the start of the
trajectory lets the person through once the image already carries them; ISM to the person's centroid at t = 250,
500, 750 shows where along the trajectory the forgetting acts. The original model is the reference (its audit job),
and a retain-validation identity treated the same way is the control (what the unlearned model still does for others).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..evaluation.generation import to_uint8_images
from ..evaluation.samples import score_samples
from ..experiment import real_latents
from ..faces.analyser import FaceAnalyser, ok_embeddings
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from .probes import control_identity
from .run import mean_row, share_row
from .verification import verified

TRAJECTORY_SEED_OFFSET = 300_000  # noise of the trajectory probe: apart from every other sample's seeds


def trajectory_samples(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame,
                       manifest: pd.DataFrame, faces: pd.DataFrame, identity: int, images: list[str], timesteps,
                       sampler_cfg: dict, seed: int) -> pd.DataFrame:
    """Scored samples: every image x every timestep, image i noised with the noise of seed + offset + i (the same
    at every t and for every model), denoised under the image's own embedding."""
    x0 = real_latents(generator, manifest, faces, images)
    emb = torch.as_tensor(np.stack(ok_embeddings(faces).loc[images].to_numpy()).astype(np.float32))
    noise = torch.stack([torch.randn(generator.latent_shape, generator=torch.Generator().manual_seed(
        seed + TRAJECTORY_SEED_OFFSET + i)) for i in range(len(images))])
    forward = generator.training_scheduler()
    rows, out = [], []
    with torch.no_grad():
        cond = generator.conditions(emb)
        for t in timesteps:
            x_t = forward.add_noise(x0, noise, torch.full((len(images),), int(t)))  # DDPM forward process q(x_t|x_0)
            latents = generator.denoise_from(cond, x_t, int(t), sampler_cfg["steps"], sampler_cfg["guidance"])
            out.append(to_uint8_images(generator.decode(latents).cpu()))
            rows += [{"sample_id": f"trajectory_{int(t)}_{image}", "setting": f"t={int(t)}", "condition": image,
                      "target_identity": identity} for image in images]
    table = pd.DataFrame(rows)
    return score_samples(table, np.concatenate(out), analyser, centroids, anchor_identity=None)


def trajectory_rows(scored: pd.DataFrame, probe: str, tau: float) -> list[dict]:
    """ISM and FA (share verified as the image's identity) per timestep."""
    is_verified = verified(scored, tau)
    rows = []
    for setting, part in scored.groupby("setting", sort=True):
        rows += [mean_row(probe, setting, "ism", part["own_cosine"]),
                 share_row(probe, setting, "fa", is_verified[part.index])]
    return rows


@logs_duration("trajectory probe")
def trajectory_probe(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame,
                     manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame, selection: dict, cfg: dict,
                     sampler_cfg: dict, tau: float, seed: int) -> list[dict]:
    """Rows of the probe on the first ``cfg['images']`` forget-validation images (probe ``trajectory``) and on as many
    images of the first retain-validation identity (``trajectory_control``)."""
    control, control_images = control_identity(selection, faces, labels)
    rows = []
    for probe, identity, images in (
            ("trajectory", selection["forget_identity"], sorted(selection["forget_val_images"])[:cfg["images"]]),
            ("trajectory_control", control, control_images[:cfg["images"]])):
        scored = trajectory_samples(generator, analyser, centroids, manifest, faces, identity, images,
                                    cfg["timesteps"], sampler_cfg, seed)
        rows += trajectory_rows(scored, probe, tau)
    return rows
