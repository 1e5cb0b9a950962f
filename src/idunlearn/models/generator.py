"""One identity-conditioned generator interface for both backends (Arc2Face and the mini Arc2Face).

condition from identity embeddings -> noise prediction -> sampling (DPM-Solver++ with classifier-free guidance)
-> decode to images. Pixel-space models (the mini generator) have no VAE: their "latents" are images in [-1, 1].
"""

from __future__ import annotations

import torch
from diffusers import DDPMScheduler, DPMSolverMultistepScheduler
from torch import nn

from .conditioning import IdentityTextEncoder


class IdentityGenerator(nn.Module):
    def __init__(self, encoder: IdentityTextEncoder, unet: nn.Module, scheduler_config: dict,
                 vae: nn.Module | None = None, vae_scale: float = 0.18215):
        super().__init__()
        self.encoder = encoder
        self.unet = unet
        self.vae = vae
        self.vae_scale = vae_scale
        self.scheduler_config = dict(scheduler_config)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        size = self.unet.config.sample_size
        return (self.unet.config.in_channels, size, size)

    @property
    def device(self) -> torch.device:
        return next(self.unet.parameters()).device

    def conditions(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.encoder(embeddings.to(self.device))

    def unconditional(self, n: int) -> torch.Tensor:
        return self.encoder.unconditional(n)

    def predict_noise(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, unet: nn.Module | None = None):
        """epsilon prediction of ``unet`` (default: this generator's) at noisy latents x_t and timesteps t."""
        return (unet or self.unet)(x_t, t, encoder_hidden_states=cond).sample

    def training_scheduler(self) -> DDPMScheduler:
        return DDPMScheduler(**self.scheduler_config)

    def sampling_scheduler(self, steps: int) -> DPMSolverMultistepScheduler:
        # pixel-space models need DPM-Solver++'s dynamic thresholding (Lu et al. 2022, Section 4): without it the
        # data prediction at t near T (alpha_t ~ 0 under the cosine schedule) blows up and samples saturate
        pixel_space = {"thresholding": True, "sample_max_value": 1.0} if self.vae is None else {}
        sched = DPMSolverMultistepScheduler(**self.scheduler_config, algorithm_type="dpmsolver++", solver_order=2,
                                            **pixel_space)
        sched.set_timesteps(steps, device=self.device)
        return sched

    @torch.no_grad()
    def sample_latents(self, cond: torch.Tensor, noise: torch.Tensor, steps: int = 25, guidance: float = 3.0):
        """Denoise ``noise`` under conditions ``cond`` with classifier-free guidance (Arc2Face: 25 steps, scale 3)."""
        sched = self.sampling_scheduler(steps)
        return self._denoise(sched, noise.to(self.device) * sched.init_noise_sigma, cond, guidance, 0)

    @torch.no_grad()
    def denoise_from(self, cond: torch.Tensor, x_t: torch.Tensor, t_start: int, steps: int = 25,
                     guidance: float = 3.0):
        """Finish denoising ``x_t`` (a clean latent noised to timestep ``t_start`` by the forward process) on the part
        of the ``steps``-step sampling schedule at or below ``t_start`` (SDEdit, Meng et al. 2022)."""
        sched = self.sampling_scheduler(steps)
        begin = int((sched.timesteps > t_start).sum())
        if begin >= len(sched.timesteps):
            raise ValueError(f"timestep {t_start} lies below the whole {steps}-step schedule; use a larger one")
        sched.set_begin_index(begin)
        return self._denoise(sched, x_t.to(self.device), cond, guidance, begin)

    def _denoise(self, sched, x: torch.Tensor, cond: torch.Tensor, guidance: float, begin: int) -> torch.Tensor:
        uncond = self.unconditional(len(cond))
        for t in sched.timesteps[begin:]:
            x_in = torch.cat([x, x])
            eps_u, eps_c = self.predict_noise(x_in, t, torch.cat([uncond, cond])).chunk(2)
            x = sched.step(eps_u + guidance * (eps_c - eps_u), t, x).prev_sample
        return x

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (N, 3, H, W) in [0, 1]."""
        images = self.vae.decode(latents / self.vae_scale).sample if self.vae is not None else latents
        return unit_rgb(images)

    def generate(self, embeddings: torch.Tensor, noise: torch.Tensor, steps: int = 25, guidance: float = 3.0,
                 batch_size: int = 16) -> torch.Tensor:
        """Images for identity embeddings (N, D) from initial noise (N, *latent_shape), in batches."""
        out = []
        for i in range(0, len(embeddings), batch_size):
            cond = self.conditions(embeddings[i:i + batch_size])
            out.append(self.decode(self.sample_latents(cond, noise[i:i + batch_size], steps, guidance)).cpu())
        return torch.cat(out)


def unit_rgb(images: torch.Tensor) -> torch.Tensor:
    """Pixels (N, C, H, W) in [-1, 1] (clamped) -> float RGB in [0, 1]; one channel is repeated to three."""
    images = (images.float().clamp(-1, 1) + 1) / 2
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


def initial_noise(shape: tuple[int, ...], seeds: list[int]) -> torch.Tensor:
    """One noise tensor per seed: sample i always starts from the same noise, before and after unlearning."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(int(s))) for s in seeds])
