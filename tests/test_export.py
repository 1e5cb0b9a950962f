"""Export of an unlearned UNet (diffusers folder + delta with the base hash), apply-delta, and the external-model
config. Two worlds: the shipped mini Arc2Face (UNet inside its own checkpoint format) and an Arc2Face-shaped
stand-in whose base is a diffusers UNet folder, as Arc2Face's arc2face/ subfolder is (no network)."""

from __future__ import annotations

import copy
import hashlib
import struct

import pytest
import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import load_file, save_file

from conftest import REPO
from idunlearn.__main__ import main
from idunlearn.config import ConfigError, load_config, run_config
from idunlearn.experiment import load_generator
from idunlearn.models.arc2face import tiny_arc2face
from idunlearn.models.export import (BaseMismatchError, export_unet, install_unet, read_delta, unet_folder_files,
                                     unet_sha256)
from idunlearn.models.generator import initial_noise
from idunlearn.unlearning import build_method
from idunlearn.unlearning.runner import apply_changed_parameters, save_changed_parameters, unlearn
from tiny_world import tiny_data

MINI = {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}}


@pytest.fixture(scope="module", params=["mini", "arc2face-standin"])
def world(request, tmp_path_factory):
    """A base generator, where its base lives on disk, and a 2-step PIU run's changed parameters (the run's file)
    together with the unlearned generator it came from."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "mini":
        base, base_path = load_generator(MINI), MINI["mini"]["checkpoint"]
    else:
        base, base_path = tiny_arc2face(), folder / "base_unet"
        base.unet.save_pretrained(base_path)
    run = {**run_config(load_config(REPO / "config" / "config.yaml"), "piu"),
           "steps": 2, "forget_batch": 2, "retain_batch": 2}
    unlearned = copy.deepcopy(base)
    data = tiny_data(dim=192 if request.param == "mini" else 512)
    unlearn(unlearned, build_method("piu", run), data, run, folder / "state.pt", seed=3)
    changed = folder / "changed_parameters.safetensors"
    save_changed_parameters(unlearned, run["regime"], run["surgical_blocks"], changed)
    hashes = export_unet(copy.deepcopy(base.unet), load_file(changed), folder / "unet", folder / "delta.safetensors")
    return {"base": base, "base_path": base_path, "unlearned": unlearned, "changed": changed, "folder": folder,
            "hashes": hashes, "embeddings": torch.tensor(data.forget_train[:2]), "name": request.param}


def samples(generator, embeddings):
    noise = initial_noise(generator.latent_shape, [11, 12])
    return generator.decode(generator.sample_latents(generator.conditions(embeddings), noise, steps=3))


def test_exported_folder_loads_with_diffusers_and_reproduces_the_runs_samples_bit_for_bit(world):
    loaded = UNet2DConditionModel.from_pretrained(world["folder"] / "unet")
    assert sorted(p.name for p in (world["folder"] / "unet").iterdir()) == sorted(
        f.split("/")[-1] for f in unet_folder_files("."))
    generator = copy.deepcopy(world["base"])
    generator.unet = loaded.eval()  # the generator takes the exported UNet as it is
    assert torch.equal(samples(generator, world["embeddings"]), samples(world["unlearned"], world["embeddings"]))
    assert world["hashes"]["result_unet_sha256"] == unet_sha256(world["unlearned"].unet)
    assert world["hashes"]["base_unet_sha256"] == unet_sha256(world["base"].unet) != unet_sha256(loaded)


def test_apply_delta_on_the_right_base_reproduces_the_unlearned_weights_exactly(world, capsys):
    out = world["folder"] / "applied"
    main(["apply-delta", "--base", str(world["base_path"]), "--delta", str(world["folder"] / "delta.safetensors"),
          "--out", str(out)])
    assert world["hashes"]["result_unet_sha256"] in capsys.readouterr().out
    applied = UNet2DConditionModel.from_pretrained(out).state_dict()
    expected = world["unlearned"].unet.state_dict()
    assert applied.keys() == expected.keys()
    assert all(torch.equal(applied[k], expected[k]) for k in expected)
    # the evaluation jobs' route (a delta installed into the configured generator) gives the same weights
    generator = install_unet(copy.deepcopy(world["base"]), world["folder"] / "delta.safetensors")
    assert unet_sha256(generator.unet) == world["hashes"]["result_unet_sha256"]


def test_a_delta_on_another_base_is_refused_naming_both_hashes(world, tmp_path):
    other = copy.deepcopy(world["base"].unet)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1.0  # one weight differs from the delta's base
    other.save_pretrained(tmp_path / "other")
    delta = world["folder"] / "delta.safetensors"
    with pytest.raises(SystemExit) as refused:
        main(["apply-delta", "--base", str(tmp_path / "other"), "--delta", str(delta), "--out", str(tmp_path / "x")])
    message = str(refused.value.code)
    assert world["hashes"]["base_unet_sha256"] in message and unet_sha256(other) in message
    assert "refused" in message and "manifest.json" in message and not (tmp_path / "x").exists()
    # an unlearned model is not the base either (applying a delta twice)
    with pytest.raises(BaseMismatchError, match=world["hashes"]["result_unet_sha256"]):
        install_unet(copy.deepcopy(world["unlearned"]), delta)
    # a delta whose tensors were altered after export does not give the recorded result
    tensors, metadata = read_delta(delta)
    name = next(iter(tensors))
    save_file({**tensors, name: tensors[name] + 1}, str(tmp_path / "damaged.safetensors"), metadata=metadata)
    with pytest.raises(BaseMismatchError, match="damaged"):
        install_unet(copy.deepcopy(world["base"]), tmp_path / "damaged.safetensors")


def test_a_folder_of_another_architecture_is_refused_naming_the_settings(world, tmp_path):
    foreign = tiny_arc2face() if world["name"] == "mini" else load_generator(MINI)
    foreign.unet.save_pretrained(tmp_path / "foreign")
    with pytest.raises(ValueError, match="does not fit the configured generator.*cross_attention_dim"):
        install_unet(copy.deepcopy(world["base"]), tmp_path / "foreign")


def test_unet_hash_is_sha256_over_sorted_names_shapes_and_float32_values():
    module = torch.nn.Module()
    module.register_parameter("b", torch.nn.Parameter(torch.tensor([1.0, -2.5])))
    module.register_parameter("a", torch.nn.Parameter(torch.tensor([[0.5]], dtype=torch.float16)))
    expected = hashlib.sha256(b"a\x001,1\x00" + struct.pack("<f", 0.5) + b"b\x002\x00" + struct.pack("<2f", 1.0, -2.5))
    assert unet_sha256(module) == expected.hexdigest()


def _config(tmp_path, external):
    return load_config(REPO / "config" / "config.yaml", {"results_dir": str(tmp_path / "results"),
                                                         "evaluation": {"external": external}})


def test_external_models_are_validated_naming_the_key(tmp_path):
    missing = {"name": "vendor", "unet": str(tmp_path / "nowhere"), "identities": [3]}
    with pytest.raises(ConfigError, match=r"config key 'evaluation\.external\.0\.unet': .*nowhere does not exist"):
        _config(tmp_path, [missing])
    with pytest.raises(ConfigError, match=r"config key 'evaluation\.external\.0': 'identities' is a required"):
        _config(tmp_path, [{"name": "vendor", "unet": str(tmp_path)}])
    exported = {"name": "piu.reimported", "unet": str(tmp_path / "results" / "export" / "piu" / "3" / "unet"),
                "identities": [3]}
    assert _config(tmp_path, [exported])["evaluation"]["external"] == [exported]  # made by the export rule
    with pytest.raises(ConfigError, match=r"'evaluation\.external\.1\.name': 'piu\.reimported' is already a run"):
        _config(tmp_path, [exported, exported])
    with pytest.raises(ConfigError, match=r"'evaluation\.external\.0\.name': 'piu' is already a run"):
        _config(tmp_path, [{**exported, "name": "piu"}])
