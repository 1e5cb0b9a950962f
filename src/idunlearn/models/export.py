"""Shipping an unlearned UNet: a diffusers folder, a small delta against the base, the base hash, apply-delta.

Base hash (``unet_sha256``): sha256 over the UNet's state dict in sorted key order; per tensor the UTF-8 header
``<name>\\0<shape, comma separated>\\0`` followed by its values as contiguous little-endian float32 (the dtype the
generator runs in; a non-floating tensor keeps its dtype, named in the header). It is a hash of the weights, not of
a file: the same weights are stored in many files (the mini world keeps its UNet inside one float16 checkpoint with
the text encoder, so no UNet file exists at all; diffusers writes .bin or safetensors, sharded or not, with headers
in any order), and a file hash would refuse a base holding identical weights. It is also computable from the model
in memory, which is all an evaluation job holds. Every base the generator loads (float16 or float32 files) hashes as
the float32 weights it actually runs with.

The delta holds the new values of the parameters the run could change (its regime), not differences: replacing
tensors reproduces the unlearned UNet bit for bit, adding float differences would not.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from diffusers import UNet2DConditionModel
from diffusers.utils import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..io import atomic_path

DELTA_FORMAT = "idunlearn-unet-delta/1"
BASE_KEY, RESULT_KEY = "base_unet_sha256", "result_unet_sha256"
HASH_DEFINITION = ("sha256 over the UNet state dict in sorted key order: per tensor '<name>\\0<shape>\\0' then its "
                   "values as little-endian float32 (idunlearn.models.export.unet_sha256)")


class BaseMismatchError(ValueError):
    """A delta was applied to a UNet other than the one it was made from (or does not give the recorded result)."""


def unet_sha256(unet: torch.nn.Module) -> str:
    """The canonical hash of a UNet's weights (see the module docstring for what it covers and why)."""
    digest = hashlib.sha256()
    state = unet.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.to(torch.float32)
        else:
            name = f"{name}\0{tensor.dtype}"
        digest.update(f"{name}\0{','.join(map(str, tensor.shape))}\0".encode())
        values = tensor.contiguous().numpy()
        digest.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()


def unet_folder_files(folder: str | Path) -> list[str]:
    """The two files ``save_pretrained`` writes for a UNet (safetensors, one shard): config and weights."""
    return [os.path.join(folder, CONFIG_NAME), os.path.join(folder, SAFETENSORS_WEIGHTS_NAME)]


def unet_source_files(source: str | Path) -> list[str]:
    """The files an external UNet ``source`` consists of: a delta ``.safetensors`` file, or a diffusers folder."""
    return [str(source)] if str(source).endswith(".safetensors") else unet_folder_files(source)


def unet_source(files) -> str:
    """The external UNet a job's input files stand for (inverse of ``unet_source_files``): the delta file, or the
    folder of a diffusers UNet's files; a single path is returned as it is."""
    files = [str(files)] if isinstance(files, (str, Path)) else [str(f) for f in files]
    return files[0] if len(files) == 1 else os.path.dirname(files[0])


def write_delta(tensors: dict[str, torch.Tensor], base_sha256: str, result_sha256: str, path: str | Path) -> None:
    metadata = {"format": DELTA_FORMAT, BASE_KEY: base_sha256, RESULT_KEY: result_sha256}
    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)


def read_delta(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) of a delta file; a safetensors file without a base hash is not a delta."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != DELTA_FORMAT or BASE_KEY not in metadata:
        raise ValueError(f"{path} is not an idunlearn UNet delta (no '{BASE_KEY}' in its safetensors metadata); "
                         "export one with `snakemake export`, or pass a diffusers UNet folder instead")
    return load_file(str(path)), metadata


def apply_delta(unet: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Replace ``unet``'s parameters (in place) by the delta's, after checking that ``unet`` is the delta's base;
    the result must hash as recorded at export."""
    tensors, metadata = read_delta(path)
    actual = unet_sha256(unet)
    if actual != metadata[BASE_KEY]:
        raise BaseMismatchError(
            f"{path} applies to the base UNet with sha256 {metadata[BASE_KEY]}, but the given base has sha256 "
            f"{actual} ({HASH_DEFINITION}). Apply it to the base it was made from (manifest.json beside the delta "
            "names it), or use the exported full UNet folder (unet/) instead of the delta.")
    own = unet.state_dict()
    wrong = sorted(n for n, t in tensors.items() if n not in own or own[n].shape != t.shape)
    if wrong:
        raise BaseMismatchError(f"{path} holds tensors this UNet lacks or shapes it differs in (e.g. {wrong[:3]})")
    unet.load_state_dict({n: t.to(own[n].dtype) for n, t in tensors.items()}, strict=False)
    result = unet_sha256(unet)
    if result != metadata[RESULT_KEY]:  # the tensors were altered after export (or the file is corrupt)
        raise BaseMismatchError(f"{path}: the UNet it gives has sha256 {result}, not the {metadata[RESULT_KEY]} "
                                "recorded at export; the delta file is damaged, export it again")
    return unet


def export_unet(unet: UNet2DConditionModel, changed: dict[str, torch.Tensor], folder: str | Path,
                delta: str | Path) -> dict:
    """Apply ``changed`` (an unlearning run's parameters) to the base ``unet`` (in place), write the result as a
    diffusers folder (``save_pretrained``, safetensors) and the delta with both hashes; returns the hashes."""
    base = unet_sha256(unet)
    unet.load_state_dict(changed, strict=False)
    result = unet_sha256(unet)
    unet.save_pretrained(str(folder), safe_serialization=True)
    write_delta(changed, base, result, delta)
    return {BASE_KEY: base, RESULT_KEY: result, "changed_tensors": len(changed),
            "changed_parameters": int(sum(t.numel() for t in changed.values())), "hash": HASH_DEFINITION}


def load_unet_folder(folder: str | Path) -> UNet2DConditionModel:
    """A diffusers UNet folder (``UNet2DConditionModel.from_pretrained``), in float32 on the CPU."""
    missing = [f for f in unet_folder_files(folder) if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{folder} is not a diffusers UNet folder: {missing} missing (expected "
                                "`save_pretrained` output with safetensors)")
    # low_cpu_mem_usage needs accelerate, which idunlearn does not depend on
    return UNet2DConditionModel.from_pretrained(str(folder), torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()


def load_base_unet(path: str | Path) -> UNet2DConditionModel:
    """The UNet of a base model on disk: a diffusers UNet folder (Arc2Face's ``arc2face`` subfolder) or a mini
    Arc2Face checkpoint folder (``model.safetensors`` + ``config.json`` with its architecture)."""
    path = Path(path)
    if (path / SAFETENSORS_WEIGHTS_NAME).is_file():
        return load_unet_folder(path)
    if (path / "model.safetensors").is_file() and "architecture" in json.loads((path / CONFIG_NAME).read_text()):
        from .mini import load_mini_generator

        return load_mini_generator(path).unet
    raise FileNotFoundError(f"{path} holds no base UNet: expected a diffusers UNet folder ({SAFETENSORS_WEIGHTS_NAME} "
                            "+ config.json) or a mini Arc2Face checkpoint (model.safetensors + config.json)")


def install_unet(generator, source: str | Path):
    """Put an external UNet into ``generator`` (in place; text encoder, VAE and schedule stay): a delta file is
    applied to the generator's own UNet (its base-hash check included), a diffusers folder replaces it."""
    if str(source).endswith(".safetensors"):
        apply_delta(generator.unet, source)
        return generator
    unet = load_unet_folder(source)
    keys = ("in_channels", "out_channels", "sample_size", "cross_attention_dim")
    differ = {k: (unet.config[k], generator.unet.config[k]) for k in keys if unet.config[k] != generator.unet.config[k]}
    if differ:
        raise ValueError(f"{source}: this UNet does not fit the configured generator (setting: (UNet, generator)) "
                         f"{differ}; an Arc2Face-compatible UNet takes the generator's latents and conditions")
    generator.unet = unet.to(generator.device)
    return generator


def _changes(base: dict[str, torch.Tensor], changed: list[dict[str, torch.Tensor]]) -> list[str]:
    """The parameter names every run in ``changed`` holds (the same set in each; all in ``base``)."""
    if not changed:
        raise ValueError("merging needs at least one run's changed parameters")
    names = sorted(changed[0])
    for index, run in enumerate(changed):
        if sorted(run) != names:
            raise ValueError(f"run {index} of the merge changed other parameters than run 0 (e.g. "
                             f"{sorted(set(run) ^ set(names))[:3]}): merge runs of one regime")
    missing = [n for n in names if n not in base]
    if missing:
        raise ValueError(f"the base lacks parameters the runs changed (e.g. {missing[:3]}): wrong base model?")
    return names


def merge_changes(base: dict[str, torch.Tensor], changed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The sum of N runs' changes on one base (task arithmetic, Ilharco et al. 2023: theta = theta_0 + sum_j
    (theta_j - theta_0)), per parameter the runs changed. Added in float64 and rounded once to the base's dtype, so
    that one run's parameters come back bit for bit (their float64 difference to a float32 base is exact)."""
    out = {}
    for name in _changes(base, changed):
        start = base[name].detach().to(torch.float64)
        total = start + sum(run[name].detach().to(torch.float64) - start for run in changed)
        out[name] = total.to(base[name].dtype)
    return out


def is_condition_projection(name: str) -> bool:
    """A cross-attention key or value weight: the only parameters that act on the identity condition alone."""
    return ".attn2.to_k." in name or ".attn2.to_v." in name


def merge_regmean(base: dict[str, torch.Tensor], changed: list[dict[str, torch.Tensor]],
                  conditions: list[torch.Tensor], preserve: torch.Tensor, preserve_weight: float,
                  lam: float, others: str = "sum") -> dict[str, torch.Tensor]:
    """RegMean (Jin et al. 2023, "Dataless knowledge fusion by merging weights of language models", ICLR: each
    linear layer's merged weight solves the least-squares problem of matching every model's outputs on that model's
    own inputs, W = (sum_j W_j G_j)(sum_j G_j)^-1 with G_j = C_j^T C_j) on the cross-attention keys and values, with
    UCE's two extra terms (PIU appendix C.2 eqs. 34-35): the base's outputs kept on preserved conditions and a ridge
    pull toward the base. Every key and value weight W solves
    min sum_j ||W C_j - W_j C_j||^2 / n_j + a ||W C_p - W_0 C_p||^2 / n_p + lam ||W - W_0||^2, i.e. the normal
    equations W = (sum_j W_j G_j + a W_0 G_p + lam W_0)(sum_j G_j + a G_p + lam I)^-1 with G = C^T C / n: on run j's
    own conditions (``conditions[j]``, rows of condition tokens) the merged projection gives what run j's does, on
    the ``preserve`` rows what the base's does. Every other changed parameter (queries,
    outputs, anything that sees the image features) is the sum of changes (``merge_changes``) with ``others="sum"``,
    or keeps the base's value with ``others="base"`` (left out of the result: only keys and values change, as UCE
    edits them)."""
    if len(conditions) != len(changed):
        raise ValueError(f"{len(changed)} runs but {len(conditions)} condition sets: one set per run")
    if others not in ("sum", "base"):
        raise ValueError(f"others={others!r}: 'sum' (sum the other changed parameters' changes) or 'base' (keep them)")
    out = merge_changes(base, changed)
    if others == "base":
        out = {name: value for name, value in out.items() if is_condition_projection(name) and base[name].ndim == 2}

    def gram(rows: torch.Tensor) -> torch.Tensor:
        rows = rows.detach().reshape(-1, rows.shape[-1]).to(torch.float64)
        return rows.T @ rows / len(rows)

    grams, kept = [gram(c) for c in conditions], gram(preserve)
    for name in (n for n in out if is_condition_projection(n) and base[n].ndim == 2):
        w0 = base[name].detach().to(torch.float64)
        eye = torch.eye(w0.shape[1], dtype=torch.float64)
        lhs = sum(grams) + preserve_weight * kept + lam * eye
        rhs = sum(run[name].detach().to(torch.float64) @ g for run, g in zip(changed, grams))
        rhs = rhs + preserve_weight * w0 @ kept + lam * w0
        out[name] = torch.linalg.solve(lhs, rhs.T).T.to(base[name].dtype)  # lhs is symmetric: W = rhs lhs^-1
    return out
