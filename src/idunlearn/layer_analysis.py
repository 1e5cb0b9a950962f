"""Layerwise identity separation in the cross-attention (attn2) layers (PIU Section 3.4, Fig. 3).

Keys and values are projections of the identity condition; queries are projections of the UNet's hidden states.
A layer separates identities when its activations for two images of one identity are more alike than for two
different identities. The layers that separate most are the candidates for surgical fine-tuning
(models.layers.SURGICAL_BLOCKS).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterator

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from .io import save_figure  # noqa: E402
from .models.generator import IdentityGenerator, initial_noise  # noqa: E402
from .models.layers import SURGICAL_BLOCKS, cross_attention_layers  # noqa: E402

log = logging.getLogger(__name__)

PROJECTIONS = ("to_q", "to_k", "to_v")
# PIU Section 3.4 uses T = {750, 1000}; a 1000-step DDPM scheduler's last timestep is 999
DEFAULT_TIMESTEPS = (750, 999)


@contextlib.contextmanager
def capture_projections(unet: nn.Module, layers: list[str]) -> Iterator[dict]:
    """Yield a dict {(layer, projection): output} that every UNet forward pass overwrites; hooks removed on exit."""
    captured: dict = {}
    modules = dict(unet.named_modules())
    handles = []
    try:
        for layer in layers:
            for projection in PROJECTIONS:
                hook = _recorder(captured, (layer, projection))
                handles.append(getattr(modules[layer], projection).register_forward_hook(hook))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _recorder(captured: dict, key: tuple[str, str]):
    def hook(module, inputs, output):
        captured[key] = output.detach()
    return hook


def intra_inter(features: torch.Tensor, labels: np.ndarray) -> tuple[float, float]:
    """Mean cosine of flattened per-sample features over pairs of distinct samples with the same label (intra)
    and over pairs with different labels (inter)."""
    flat = nn.functional.normalize(features.flatten(1).double(), dim=1)
    cos = (flat @ flat.T).cpu().numpy()
    same = labels[:, None] == labels[None, :]
    distinct = ~np.eye(len(labels), dtype=bool)
    return float(cos[same & distinct].mean()), float(cos[~same].mean())


def block_of(layer: str) -> str:
    """'up_blocks.1.attentions.0.transformer_blocks.0.attn2' -> 'up_blocks.1'; mid-block layers -> 'mid_block'."""
    parts = layer.split(".")
    return parts[0] if parts[0] == "mid_block" else ".".join(parts[:2])


def short_labels(layers: list[str]) -> list[str]:
    """Fig. 3 names: D2, M, U1 for a block's only attn2 layer; U1.0, U1.1, ... when a block has several."""
    blocks = [block_of(layer) for layer in layers]
    per_block, seen = Counter(blocks), Counter()
    labels = []
    for block in blocks:
        name = "M" if block == "mid_block" else block[0].upper() + block.split(".")[1]
        labels.append(f"{name}.{seen[block]}" if per_block[block] > 1 else name)
        seen[block] += 1
    return labels


@torch.no_grad()
def layer_separation(generator: IdentityGenerator, embeddings: torch.Tensor, identity_labels,
                     timesteps=DEFAULT_TIMESTEPS, seed: int = 0, batch_size: int = 16,
                     surgical_blocks=SURGICAL_BLOCKS) -> pd.DataFrame:
    """One row per attn2 layer (forward order): S^K, S^V, their mean S^KV, S^Q and the intra/inter means behind them.

    Every identity's UNet input at each t in ``timesteps`` is the same noise (from ``seed``), so query differences
    come from the identity condition alone. Since identity enters only through cross-attention (Arc2Face, mini), the
    first attn2 layer's queries cannot separate identities (S^Q = 0): its hidden states have not seen the condition.
    """
    labels = np.asarray(identity_labels)
    _check_inputs(generator, embeddings, labels, timesteps)
    layers = cross_attention_layers(generator.unet)
    noise = initial_noise(generator.latent_shape, [seed]).to(generator.device)
    keys, values = defaultdict(list), defaultdict(list)
    queries = {t: defaultdict(list) for t in timesteps}
    with capture_projections(generator.unet, layers) as captured:
        for start in range(0, len(labels), batch_size):
            cond = generator.conditions(embeddings[start:start + batch_size])
            x_t = noise.expand(len(cond), *noise.shape[1:])
            for t in timesteps:
                generator.predict_noise(x_t, torch.full((len(cond),), t, device=generator.device), cond)
                for layer in layers:
                    queries[t][layer].append(captured[layer, "to_q"].cpu())
            # keys and values project the condition only, so one pass's are every timestep's (PIU Section 3.4)
            for layer in layers:
                keys[layer].append(captured[layer, "to_k"].cpu())
                values[layer].append(captured[layer, "to_v"].cpu())

    rows = []
    for layer, label in zip(layers, short_labels(layers)):
        intra_k, inter_k = intra_inter(torch.cat(keys[layer]), labels)
        intra_v, inter_v = intra_inter(torch.cat(values[layer]), labels)
        inter_q = float(np.mean([intra_inter(torch.cat(queries[t][layer]), labels)[1] for t in timesteps]))
        s_k = intra_k - inter_k  # PIU Section 3.4: S^K_l = Intra^K_l - Inter^K_l
        s_v = intra_v - inter_v  # PIU Section 3.4: S^V_l = Intra^V_l - Inter^V_l
        rows.append({
            "layer": layer, "block": block_of(layer), "label": label,
            "resolution": math.isqrt(queries[timesteps[0]][layer][0].shape[1]),  # query tokens = H * W (square)
            "s_k": s_k, "s_v": s_v,
            "s_kv": (s_k + s_v) / 2,  # PIU Section 3.4: one K/V separation S^KV_l, here the mean of S^K and S^V
            "s_q": 1 - inter_q,  # PIU Section 3.4: S^Q_l = 1 - (1/|T|) sum_{t in T} Inter^Q_{l,t}
            "intra_k": intra_k, "inter_k": inter_k, "intra_v": intra_v, "inter_v": inter_v, "inter_q": inter_q,
            "in_surgical_set": layer.startswith(tuple(surgical_blocks)),
        })
    return pd.DataFrame(rows)


def _check_inputs(generator: IdentityGenerator, embeddings: torch.Tensor, labels: np.ndarray, timesteps) -> None:
    if len(labels) != len(embeddings):
        raise ValueError(f"{len(embeddings)} embeddings but {len(labels)} identity labels")
    _, counts = np.unique(labels, return_counts=True)
    if len(counts) < 2 or counts.max() < 2:
        raise ValueError("layer separation needs 2+ identities and 2+ samples of some identity "
                         f"(got {len(counts)} identities, largest with {counts.max(initial=0)} samples)")
    n_steps = generator.training_scheduler().config.num_train_timesteps
    if not timesteps or not all(0 <= t < n_steps for t in timesteps):
        raise ValueError(f"timesteps {list(timesteps)} must be non-empty and within [0, {n_steps - 1}]")


def analysis_samples(faces: pd.DataFrame, labels: pd.DataFrame, n_identities: int, images_per_identity: int,
                     seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Embeddings (N, D) and identity labels of ``images_per_identity`` faces of each of ``n_identities`` identities.

    A seeded random choice among the identities with enough faces (status ok), and of their faces.
    """
    ok = faces.loc[faces["status"] == "ok", ["image_id", "embedding"]]
    ok = ok.merge(labels[["image_id", "identity"]], on="image_id").sort_values("image_id")
    sizes = ok["identity"].value_counts()
    eligible = np.sort(sizes.index[sizes >= images_per_identity].to_numpy())
    if len(eligible) < 2:
        raise ValueError(f"only {len(eligible)} identities have {images_per_identity}+ faces: lower "
                         "layer_analysis.images_per_identity")
    if len(eligible) < n_identities:
        log.warning("only %d identities have %d+ faces; using all of them", len(eligible), images_per_identity)
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(eligible, size=min(n_identities, len(eligible)), replace=False))
    picked = pd.concat([ok[ok["identity"] == i].sample(images_per_identity, random_state=rng) for i in chosen])
    log.info("layer analysis on %d identities x %d faces", len(chosen), images_per_identity)
    embeddings = torch.tensor(np.stack(picked["embedding"].to_numpy()), dtype=torch.float32)
    return embeddings, picked["identity"].to_numpy()


def plot_layer_separation(table: pd.DataFrame, path: str | Path) -> None:
    """S^K, S^V and S^Q per attn2 layer in forward order (PIU Fig. 3); dashed lines enclose the surgical layers."""
    x = np.arange(len(table))
    width = 0.27
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(table) + 2), 3.5))
    for offset, column, name, color in ((-width, "s_k", "$S^K$", "#4c72b0"), (0, "s_v", "$S^V$", "#55a868"),
                                        (width, "s_q", "$S^Q$", "#c44e52")):
        ax.bar(x + offset, table[column], width, label=name, color=color)
    surgical = np.concatenate([[0], table["in_surgical_set"].to_numpy(int), [0]])
    for k, edge in enumerate(np.flatnonzero(np.diff(surgical))):  # first layer of a surgical run, one past its last
        ax.axvline(edge - 0.5, color="k", linestyle="--", linewidth=1, label="surgical layers" if k == 0 else None)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xticks(x, [f"{label}\n{res}x{res}" for label, res in zip(table["label"], table["resolution"])], fontsize=8)
    ax.set_xlabel("cross-attention layer (forward order) and its spatial size")
    ax.set_ylabel("identity separation")
    ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)  # above the bars
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
