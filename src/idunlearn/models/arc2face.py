"""The paper backend: Arc2Face (fine-tuned SD1.5 UNet + fine-tuned CLIP ViT-L/14 text encoder) and the SD1.5 VAE.

``load_arc2face`` reads the pinned hub revisions (no network when ``local_files_only``); ``random_arc2face`` builds
the same architecture with random weights (tests, benchmarks); ``tiny_arc2face`` is an Arc2Face-shaped model
small enough for a CPU. The hub facts and parameter counts are in shared/notes/reference-facts.md.
"""

from __future__ import annotations

import inspect
import warnings

import torch
from diffusers import AutoencoderKL, DDPMScheduler, DPMSolverMultistepScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from ..assets import AssetError
from ..faces.insightface_backend import ARC2FACE_REPO, ARC2FACE_REVISION
from .conditioning import SEQUENCE_LENGTH, IdentityTextEncoder, check_template_ids
from .generator import IdentityGenerator
from .mini import build_mini_generator

SD15_REPO = "stable-diffusion-v1-5/stable-diffusion-v1-5"
SD15_REVISION = "451f4fe16113bff5a5d2269ed5ad43b0592e9a14"

SD15_DOWN_BLOCKS = ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D")
SD15_UP_BLOCKS = ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")

# SD1.5's scheduler/scheduler_config.json (a PNDMScheduler file); only the keys the generator's schedulers accept
# survive scheduler_kwargs.
SD15_SCHEDULER_FILE = {
    "_class_name": "PNDMScheduler", "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "trained_betas": None, "set_alpha_to_one": False, "skip_prk_steps": True,
    "steps_offset": 1, "clip_sample": False,
}


def sd15_unet_config() -> dict:
    """SD1.5's UNet2DConditionModel config (Arc2Face fine-tunes this architecture: 859,520,964 parameters)."""
    return {
        "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False,
        "flip_sin_to_cos": True, "freq_shift": 0, "down_block_types": SD15_DOWN_BLOCKS,
        "up_block_types": SD15_UP_BLOCKS, "block_out_channels": (320, 640, 1280, 1280), "layers_per_block": 2,
        "downsample_padding": 1, "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32,
        "norm_eps": 1e-5, "cross_attention_dim": 768, "attention_head_dim": 8,  # legacy name: 8 heads
    }


def clip_vit_l14_text_config() -> CLIPTextConfig:
    """CLIP ViT-L/14 text encoder, as in SD1.5's text_encoder/config.json (Arc2Face fine-tunes it: 123.06M).

    That file carries the pre-2023 special ids bos 0 / eos 2 (pad 1): with eos_token_id == 2 transformers pools at
    the argmax input id, which is EOS 49407 for CLIP ids. Only the pooled output depends on them; Arc2Face's
    condition is the last hidden state.
    """
    return CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=SEQUENCE_LENGTH, hidden_act="quick_gelu", layer_norm_eps=1e-5,
        attention_dropout=0.0, dropout=0.0, initializer_range=0.02, initializer_factor=1.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )


def scheduler_kwargs(config: dict) -> dict:
    """The keys of a hub scheduler config that both of the generator's schedulers accept.

    IdentityGenerator builds DDPMScheduler (training) and DPMSolverMultistepScheduler (sampling) from one dict, so
    PNDM-only keys (set_alpha_to_one, skip_prk_steps) and DDPM-only ones (clip_sample, which only DDPM sampling
    reads; training uses add_noise) are dropped, as ``from_config`` would ignore them.
    """
    accepted = [set(inspect.signature(cls.__init__).parameters) - {"self"}
                for cls in (DDPMScheduler, DPMSolverMultistepScheduler)]
    return {k: v for k, v in config.items() if all(k in keys for keys in accepted)}


def sd15_scheduler_config() -> dict:
    """SD1.5's noise schedule for the generator: DDPM, 1000 steps, scaled-linear betas 0.00085-0.012, epsilon."""
    return scheduler_kwargs({**SD15_SCHEDULER_FILE, "prediction_type": "epsilon"})


def _from_hub(load, repo: str, subfolder: str, revision: str, what: str, **kwargs):
    try:
        return load(repo, subfolder=subfolder, revision=revision, **kwargs)
    # hub errors differ across huggingface_hub versions and transports; keep the cause chained.
    except Exception as exc:
        raise AssetError(
            f"could not load the {what} from hub repo {repo}, subfolder {subfolder!r}, revision {revision} "
            f"({type(exc).__name__}: {exc}). On a machine that reaches huggingface.co run "
            f"`hf download {repo} --revision {revision} --include '{subfolder}/*'` (docs/paper-setup.md), copy the cache "
            f"folder here and point HF_HOME (or cache_dir) at it; local_files_only=True then needs no network."
        ) from exc


def load_arc2face(device: str | torch.device = "cuda", dtype: torch.dtype = torch.float32, cache_dir=None,
                  local_files_only: bool = False) -> IdentityGenerator:
    """Arc2Face at the pinned revisions: its text encoder and UNet, SD1.5's VAE and noise schedule."""
    hub = {"cache_dir": cache_dir, "local_files_only": local_files_only}
    text = _from_hub(CLIPTextModel.from_pretrained, ARC2FACE_REPO, "encoder", ARC2FACE_REVISION,
                     "Arc2Face text encoder", **hub)
    unet = _from_hub(UNet2DConditionModel.from_pretrained, ARC2FACE_REPO, "arc2face", ARC2FACE_REVISION,
                     "Arc2Face UNet", **hub)
    vae = _from_hub(AutoencoderKL.from_pretrained, SD15_REPO, "vae", SD15_REVISION, "SD1.5 VAE", **hub)
    scheduler = _from_hub(DDPMScheduler.load_config, SD15_REPO, "scheduler", SD15_REVISION,
                          "SD1.5 scheduler config", **hub)
    check_sd15_tokenizer(**hub)
    for frozen in (text, vae):  # only UNet parameters are ever trained
        frozen.requires_grad_(False).eval()
    generator = IdentityGenerator(IdentityTextEncoder(text), unet.eval(), scheduler_kwargs(dict(scheduler)), vae=vae,
                                  vae_scale=vae.config.scaling_factor)
    return generator.to(device=device, dtype=dtype)


def check_sd15_tokenizer(cache_dir=None, local_files_only: bool = False) -> bool:
    """Check the template's hard-coded token ids against SD1.5's tokenizer files (vocab.json, merges.txt) at the
    pinned revision (``conditioning.check_template_ids``); True when checked. Only the ids are used, so a cache
    without the tokenizer folder still loads, with a warning saying the ids went unchecked."""
    try:
        tokenizer = CLIPTokenizer.from_pretrained(SD15_REPO, subfolder="tokenizer", revision=SD15_REVISION,
                                                  cache_dir=cache_dir, local_files_only=local_files_only)
    # hub errors differ across huggingface_hub versions and transports
    except Exception as exc:
        warnings.warn(f"SD1.5's tokenizer ({SD15_REPO}, subfolder 'tokenizer', revision {SD15_REVISION}) could not "
                      f"be loaded ({type(exc).__name__}: {exc}); the template's token ids are used unchecked")
        return False
    check_template_ids(lambda text: tokenizer(text).input_ids)
    return True


def random_arc2face(sample_size: int = 64, device: str | torch.device = "cpu", seed: int = 0) -> IdentityGenerator:
    """Arc2Face's architecture with random weights and no VAE (PIU steps run in latent space)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text = CLIPTextModel(clip_vit_l14_text_config()).eval()
        unet = UNet2DConditionModel(**{**sd15_unet_config(), "sample_size": sample_size}).eval()
    return IdentityGenerator(IdentityTextEncoder(text), unet, sd15_scheduler_config()).to(device)


def tiny_arc2face(sample_size: int = 8, device: str | torch.device = "cpu", seed: int = 0) -> IdentityGenerator:
    """An Arc2Face-shaped model for CPUs: SD1.5's block layout and 768-wide conditions at a fraction of the size.

    UNet (32, 64, 128, 128) channels: 10.4M parameters with the same 16 attn2 modules (9 surgical); a one-layer
    768-wide text encoder whose vocabulary is only the template's tokens (mini Arc2Face's token map).
    """
    arch = {"image_size": sample_size, "channels": 4, "text_width": 768, "text_layers": 1, "text_heads": 12,
            "block_out_channels": [32, 64, 128, 128], "layers_per_block": 2, "attention_head_dim": 8,
            "down_block_types": list(SD15_DOWN_BLOCKS), "up_block_types": list(SD15_UP_BLOCKS),
            "scheduler": sd15_scheduler_config()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = build_mini_generator(arch)
    return generator.eval().to(device)
