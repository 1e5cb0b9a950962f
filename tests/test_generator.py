import json

import numpy as np
import pytest
import torch

from idunlearn.models.conditioning import ID_TOKEN_POSITION
from idunlearn.models.generator import initial_noise
from idunlearn.models.mini import build_mini_generator, load_mini_generator, save_mini_generator

TINY = {"image_size": 8, "text_width": 32, "text_heads": 2, "block_out_channels": [32, 32, 32, 32],
        "layers_per_block": 1}


def test_identity_enters_only_through_the_id_slot():
    gen = build_mini_generator(TINY)
    a, b = torch.randn(2, 16)
    ca, cb = gen.conditions(torch.stack([a, b]))
    # causal text encoder: positions before the id token cannot see it
    torch.testing.assert_close(ca[:ID_TOKEN_POSITION], cb[:ID_TOKEN_POSITION])
    assert not torch.allclose(ca[ID_TOKEN_POSITION:], cb[ID_TOKEN_POSITION:])
    # the embedding is L2-normalised before padding: scaling it changes nothing
    torch.testing.assert_close(gen.conditions(3 * a[None]), ca[None])
    with pytest.raises(ValueError, match="exceeds encoder width"):
        gen.conditions(torch.randn(1, 64))


def test_save_load_roundtrip_in_float16(tmp_path):
    gen = build_mini_generator(TINY)
    save_mini_generator(gen, tmp_path, {"training": {"seed": 1}})
    loaded = load_mini_generator(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["training"] == {"seed": 1}
    for (name, p), (_, q) in zip(gen.state_dict().items(), loaded.state_dict().items()):
        assert q.dtype == torch.float32
        torch.testing.assert_close(p.half().float(), q, msg=name)
    with pytest.raises(FileNotFoundError, match="train_generator"):
        load_mini_generator(tmp_path / "missing")


def test_sampling_is_seeded_and_in_range():
    gen = build_mini_generator(TINY).eval()
    emb = torch.randn(3, 16)
    noise = initial_noise(gen.latent_shape, [1, 2, 3])
    torch.testing.assert_close(noise[1], initial_noise(gen.latent_shape, [2])[0])
    images = gen.generate(emb, noise, steps=3, guidance=3.0)
    assert images.shape == (3, 3, 8, 8) and images.min() >= 0 and images.max() <= 1
    torch.testing.assert_close(images, gen.generate(emb, noise, steps=3, guidance=3.0))
    assert np.isfinite(images.numpy()).all()


def test_denoise_from_runs_the_tail_of_the_schedule():
    gen = build_mini_generator(TINY).eval()
    cond = gen.conditions(torch.randn(2, 16))
    x = initial_noise(gen.latent_shape, [1, 2])
    steps = 10
    timesteps = gen.sampling_scheduler(steps).timesteps
    # from above the first timestep, SDEdit is ordinary sampling from that noise (DPM-Solver's init sigma is 1)
    torch.testing.assert_close(gen.denoise_from(cond, x, 999, steps), gen.sample_latents(cond, x, steps))
    calls = []
    handle = gen.unet.register_forward_hook(lambda module, args, output: calls.append(1))
    start = int(timesteps[6])
    out = gen.denoise_from(cond, x, start, steps)
    handle.remove()
    assert len(calls) == int((timesteps <= start).sum()) == steps - 6 and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="below the whole"):
        gen.denoise_from(cond, x, int(timesteps[-1]) - 1, steps)
