"""The paper backend on its real architectures with random weights: conditioning, trainable sets, pinned loading,
and one PIU step on the 860M-parameter UNet. Nothing here touches the network."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL, DDPMScheduler, DPMSolverMultistepScheduler, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from idunlearn.assets import AssetError
from idunlearn.benchmarks import random_unlearning_data
from idunlearn.faces.insightface_backend import ARC2FACE_REPO, ARC2FACE_REVISION
from idunlearn.models import arc2face
from idunlearn.models.arc2face import (SD15_REPO, SD15_REVISION, SD15_SCHEDULER_FILE, load_arc2face, random_arc2face,
                                       sd15_scheduler_config, tiny_arc2face)
from idunlearn.models.conditioning import (EMPTY_PROMPT_IDS, ID_PROMPT, ID_PROMPT_IDS, ID_TOKEN, ID_TOKEN_POSITION,
                                           SEQUENCE_LENGTH, check_template_ids)
from idunlearn.models.generator import IdentityGenerator
from idunlearn.models.layers import SURGICAL_BLOCKS, cross_attention_layers, trainable_parameter_names
from idunlearn.unlearning import build_method
from idunlearn.unlearning.runner import unlearn
from paper_hub import clip_alphabet, write_clip_tokenizer


@pytest.fixture(scope="module")
def paper_generator() -> IdentityGenerator:
    """Arc2Face's real architectures (CLIP ViT-L/14 text encoder, SD1.5 UNet) with random weights: ~4 GB, seconds."""
    generator = random_arc2face(seed=0)
    generator.requires_grad_(False)  # frozen, as in unlearning; gradients must still reach the identity embedding
    return generator


def parameter_count(unet, regime: str) -> int:
    names = set(trainable_parameter_names(unet, regime))
    return sum(p.numel() for n, p in unet.named_parameters() if n in names)


# --- conditioning on the real CLIP ViT-L/14 text encoder ---------------------------------------------------------

def test_id_token_overwrites_only_its_own_row(paper_generator):
    encoder = paper_generator.encoder
    token_embedding = encoder.text_model.embeddings.token_embedding
    seen = []  # registered after the encoder's own hook, so it sees the edited rows
    handle = token_embedding.register_forward_hook(lambda module, inputs, output: seen.append(output.detach()))
    identities = torch.randn(2, 512)
    try:
        with torch.no_grad():
            encoder(identities)
    finally:
        handle.remove()
    ids = encoder.id_ids[0]
    assert ID_TOKEN_POSITION == 4 and ids.shape == (SEQUENCE_LENGTH,) and int(ids[ID_TOKEN_POSITION]) == ID_TOKEN
    rows, plain = seen[0], token_embedding.weight[ids]
    assert rows.shape == (2, SEQUENCE_LENGTH, 768)
    differs = (rows != plain).any(dim=-1)
    assert differs[:, ID_TOKEN_POSITION].all() and int(differs.sum()) == 2
    torch.testing.assert_close(rows[:, ID_TOKEN_POSITION], encoder.pad_embedding(identities))
    torch.testing.assert_close(rows[:, ID_TOKEN_POSITION, 512:], torch.zeros(2, 256))  # 512 -> 768 zero padding


def test_identity_changes_the_condition_from_its_position_on_and_carries_gradients(paper_generator):
    identities = torch.randn(2, 512, requires_grad=True)
    cond = paper_generator.conditions(identities)
    assert cond.shape == (2, SEQUENCE_LENGTH, 768)
    # causal mask: positions before the id token never see it
    torch.testing.assert_close(cond[0, :ID_TOKEN_POSITION], cond[1, :ID_TOKEN_POSITION], rtol=0, atol=1e-5)
    gap = (cond[0, ID_TOKEN_POSITION:] - cond[1, ID_TOKEN_POSITION:]).abs().amax(dim=-1)
    assert bool((gap > 1e-3).all()), "every position from the id token on should depend on the identity"
    cond[:, ID_TOKEN_POSITION:].square().sum().backward()
    assert torch.isfinite(identities.grad).all() and (identities.grad.norm(dim=-1) > 0).all()


# --- trainable parameter sets on the real SD1.5 UNet ---------------------------------------------------------------

def test_sd15_unet_trainable_sets_match_the_paper(paper_generator):
    unet = paper_generator.unet
    total = sum(p.numel() for p in unet.parameters())
    surgical = parameter_count(unet, "surgical")
    assert total == 859_520_964
    assert surgical == 36_873_600 and round(100 * surgical / total, 2) == 4.29  # PIU: 37M / 4.29%
    assert parameter_count(unet, "all_cross_attention") == 43_962_560  # PIU: 44M / 5.11%
    layers = cross_attention_layers(unet)
    assert len(layers) == 16 and sum(name.startswith(SURGICAL_BLOCKS) for name in layers) == 9


def test_sd15_scheduler_config_builds_both_schedulers():
    config = sd15_scheduler_config()
    training = DDPMScheduler(**config)
    DPMSolverMultistepScheduler(**config, algorithm_type="dpmsolver++", solver_order=2)
    assert training.config.num_train_timesteps == 1000 and training.config.prediction_type == "epsilon"
    assert training.config.beta_schedule == "scaled_linear" and training.config.steps_offset == 1
    torch.testing.assert_close(training.betas[[0, -1]], torch.tensor([0.00085, 0.012]))


# --- loading at pinned revisions ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stand_ins() -> dict:
    """Small models returned by the patched loaders (CLIP vocabulary kept: the encoder indexes CLIP ids)."""
    text = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                        num_attention_heads=2, max_position_embeddings=SEQUENCE_LENGTH))
    unet = UNet2DConditionModel(sample_size=8, block_out_channels=(32, 64), layers_per_block=1,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32)
    return {"encoder": text, "arc2face": unet, "vae": AutoencoderKL(),
            "scheduler": {**SD15_SCHEDULER_FILE, "_diffusers_version": "0.6.0"}}


@pytest.fixture(scope="module")
def sd15_tokenizer_folder(tmp_path_factory):
    """SD1.5's tokenizer files cut down to the template (tests/paper_hub.py), at the ids the package hard-codes."""
    folder = tmp_path_factory.mktemp("tokenizer") / "tokenizer"
    write_clip_tokenizer(folder)
    return folder


def patch_loaders(monkeypatch, stand_ins: dict, failing: str | None = None, tokenizer=None) -> dict:
    """Replace every hub loader load_arc2face uses; record the keyword arguments each receives. The tokenizer
    comes from the folder ``tokenizer`` (None: absent from the cache)."""
    calls, read_tokenizer = {}, CLIPTokenizer.from_pretrained

    def load(repo, subfolder, **kwargs):
        calls[subfolder] = {"repo": repo, **kwargs}
        if subfolder == failing or (subfolder == "tokenizer" and tokenizer is None):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
        return read_tokenizer(tokenizer) if subfolder == "tokenizer" else stand_ins[subfolder]

    for cls, name in ((arc2face.CLIPTextModel, "from_pretrained"), (arc2face.UNet2DConditionModel, "from_pretrained"),
                      (arc2face.AutoencoderKL, "from_pretrained"), (arc2face.DDPMScheduler, "load_config"),
                      (arc2face.CLIPTokenizer, "from_pretrained")):
        monkeypatch.setattr(cls, name, load)
    return calls


def test_every_hub_load_is_pinned(monkeypatch, stand_ins, tmp_path, sd15_tokenizer_folder):
    calls = patch_loaders(monkeypatch, stand_ins, tokenizer=sd15_tokenizer_folder)
    generator = load_arc2face(device="cpu", cache_dir=tmp_path, local_files_only=True)
    expected = {"encoder": (ARC2FACE_REPO, ARC2FACE_REVISION), "arc2face": (ARC2FACE_REPO, ARC2FACE_REVISION),
                "vae": (SD15_REPO, SD15_REVISION), "scheduler": (SD15_REPO, SD15_REVISION),
                "tokenizer": (SD15_REPO, SD15_REVISION)}
    assert {sub: (c["repo"], c["revision"]) for sub, c in calls.items()} == expected
    assert all(c["cache_dir"] == tmp_path and c["local_files_only"] is True for c in calls.values())
    assert generator.unet is stand_ins["arc2face"] and generator.vae is stand_ins["vae"]
    assert generator.encoder.text_model is stand_ins["encoder"] and generator.encoder.token_map is None
    assert generator.vae_scale == pytest.approx(0.18215)
    assert not any(p.requires_grad for p in generator.encoder.parameters())
    assert not {"set_alpha_to_one", "skip_prk_steps", "_class_name"} & set(generator.scheduler_config)
    torch.testing.assert_close(generator.training_scheduler().betas, DDPMScheduler(**sd15_scheduler_config()).betas)
    generator.sampling_scheduler(2)  # the same dict must also build the DPM-Solver++ sampler


@pytest.mark.parametrize("failing", ["encoder", "arc2face", "vae", "scheduler"])
def test_hub_failure_is_an_asset_error_naming_the_revision(monkeypatch, stand_ins, failing):
    patch_loaders(monkeypatch, stand_ins, failing=failing)
    repo, revision = (ARC2FACE_REPO, ARC2FACE_REVISION) if failing in ("encoder", "arc2face") else (
        SD15_REPO, SD15_REVISION)
    with pytest.raises(AssetError) as excinfo:
        load_arc2face(device="cpu", local_files_only=True)
    message = str(excinfo.value)
    for part in (repo, repr(failing), revision, "hf download", "HF_HOME"):
        assert part in message
    assert isinstance(excinfo.value.__cause__, OSError)


# --- the template's token ids against SD1.5's tokenizer files ------------------------------------------------------

def test_the_template_ids_come_from_the_tokenizer_when_its_files_are_there(sd15_tokenizer_folder):
    tokenizer = CLIPTokenizer.from_pretrained(sd15_tokenizer_folder)
    assert tokenizer(ID_PROMPT).input_ids == ID_PROMPT_IDS and tokenizer("").input_ids == EMPTY_PROMPT_IDS
    # independent of the hard-coded list: a one-letter word is its byte-alphabet character + '</w>' at 256 + position
    assert ID_PROMPT_IDS[ID_PROMPT.split().index("a") + 1] == 256 + clip_alphabet().index("a")
    check_template_ids(lambda text: tokenizer(text).input_ids)


def test_a_tokenizer_with_other_ids_stops_the_load(monkeypatch, stand_ins, tmp_path):
    folder = tmp_path / "tokenizer"
    write_clip_tokenizer(folder, {**dict(zip(ID_PROMPT.split(), ID_PROMPT_IDS[1:-1])), "id": 1015})
    patch_loaders(monkeypatch, stand_ins, tokenizer=folder)
    with pytest.raises(ValueError, match=r"1015.*photo of a id person.*not SD1.5's"):
        load_arc2face(device="cpu", local_files_only=True)


def test_without_the_tokenizer_files_the_hard_coded_ids_are_used_with_a_warning(monkeypatch, stand_ins):
    calls = patch_loaders(monkeypatch, stand_ins, tokenizer=None)
    with pytest.warns(UserWarning, match="token ids are used unchecked"):
        generator = load_arc2face(device="cpu", local_files_only=True)
    assert "tokenizer" in calls and int(generator.encoder.id_ids[0, ID_TOKEN_POSITION]) == ID_TOKEN


# --- one PIU step on the real-size UNet ----------------------------------------------------------------------------

def digest(param: torch.Tensor) -> bytes:
    return hashlib.blake2b(param.detach().numpy(), digest_size=16).digest()


@pytest.mark.slow
def test_one_piu_step_on_the_real_unet_changes_only_surgical_parameters(paper_generator, tmp_path):
    """PIU at batch 1 + 1 on the SD1.5 UNet at 64x64 latents, one step: 1-2 minutes on one core, ~11 GB peak RSS
    (the module's random Arc2Face, runner.unlearn's teacher copy, activations).

    To keep it affordable the conditions come from a small random CLIP text model of width 768 (one layer, the
    template's tokens as vocabulary: tiny_arc2face's encoder) instead of the 123M ViT-L/14 encoder; the UNet sees
    conditions of the real shape (N, 77, 768).
    """
    unet = paper_generator.unet
    generator = IdentityGenerator(tiny_arc2face().encoder, unet, sd15_scheduler_config())
    before = {name: digest(p) for name, p in unet.named_parameters()}
    cfg = {"steps": 1, "regime": "surgical", "surgical_blocks": SURGICAL_BLOCKS, "checkpoint_every": 10,
           "optimiser": "weighted_sum", "lambda": 10, "lr": 1e-4, "betas": [0.9, 0.999], "adam_eps": 1e-8,
           "weight_decay": 0.01}
    method = build_method("piu", {"eta": 1.0, "forget_batch": 1, "retain_batch": 1, "dirichlet_k": 3,
                                  "dirichlet_alpha": 1.0})
    losses, timings = unlearn(generator, method, random_unlearning_data(), cfg, tmp_path / "state.pt", seed=0)
    assert len(losses) == 1 and np.isfinite(losses[["forget_loss", "retain_loss"]].to_numpy()).all()
    assert timings["trainable_parameters"] == 36_873_600
    changed = {name for name, p in unet.named_parameters() if digest(p) != before[name]}
    assert changed == set(trainable_parameter_names(unet, "surgical"))
