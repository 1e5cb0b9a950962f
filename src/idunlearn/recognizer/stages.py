"""The recognizer track's workflow stages as plain functions (the Snakemake scripts only read, call and write)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import torch

from ..config import ConfigError
from ..io import atomic_path, read_json, write_csv, write_json, write_parquet
from . import tuning, ulira
from .data import ImageData, fashion_mnist_subset, load_fashion_mnist, orl_faces
from .metrics import (COST_COLUMNS, ULIRA_COLUMNS, VALUE_COLUMNS, classwise_table, markdown, plot_speedup_vs_facc,
                      random_subset_table, speedup, summary_table)
from .mia import train_shadows
from .models import derive_seed, load_model, save_model
from .runs import Experiment, run_experiment
from .training import accuracy, train_from_scratch

_ORIGINAL = 91
log = logging.getLogger(__name__)


def set_threads(n: int) -> None:
    torch.set_num_threads(max(1, int(n)))


def orl_data(manifest: str, embeddings: str, labels: str, dataset_cfg: dict, orl_cfg: dict, seed: int) -> ImageData:
    if dataset_cfg["source"] != "orl":
        raise ConfigError(f"config key 'dataset.source': the recognizer track's face classifier is defined on the ORL "
                          f"faces of the offline world, not {dataset_cfg['source']!r}")
    data = orl_faces(pd.read_parquet(manifest), pd.read_parquet(embeddings), pd.read_parquet(labels),
                     orl_cfg["image_size"], orl_cfg["train_fraction"], seed)
    log.info("ORL: %d images, %d identities, %d train / %d test", len(data.labels), data.n_classes,
             len(data.train_idx), len(data.test_idx))
    return data


def fashion_mnist_data(fm_cfg: dict, data_dir: str, seed: int) -> ImageData:
    arrays = load_fashion_mnist(fm_cfg, os.path.join(data_dir, "assets"))
    data = fashion_mnist_subset(arrays, fm_cfg["n_train"], fm_cfg["n_test"], seed)
    log.info("Fashion-MNIST subset: %d train / %d test", len(data.train_idx), len(data.test_idx))
    return data


def train_original(data: ImageData, settings: dict, seed: int, model_path: str, info_path: str) -> dict:
    """The original model on the whole training split (``settings``: the dataset's ``model`` and ``training``); its
    train/test accuracy go into the model's metadata and, with the training time, to ``info_path``."""
    x_tr, y_tr = data.tensors(data.train_idx)
    x_te, y_te = data.tensors(data.test_idx)
    model, info = train_from_scratch(x_tr, y_tr, data.n_classes, data.images.shape[-1], settings["model"],
                                     settings["training"], derive_seed(seed, _ORIGINAL), desc=f"original {data.name}")
    meta = {"dataset": data.name, "acc_train": accuracy(model, x_tr, y_tr), "acc_test": accuracy(model, x_te, y_te),
            "n_train": len(y_tr), "n_test": len(y_te), "n_classes": data.n_classes,
            "parameters": sum(p.numel() for p in model.parameters()), "model": settings["model"],
            "training": settings["training"], "seed": seed}
    log.info("original %s: train accuracy %.4f, test accuracy %.4f (%.1f s)", data.name, meta["acc_train"],
             meta["acc_test"], info["seconds"])
    save_model(model, model_path, meta)
    write_json({**meta, "seconds": info["seconds"]}, info_path)
    return meta


def shadows(data: ImageData, settings: dict, mia_cfg: dict, seed: int, path: str) -> None:
    result = train_shadows(data, settings["model"], settings["training"], mia_cfg["n_shadows"], seed)
    _save_npz(path, membership=result["membership"], phi=result["phi"], ids=result["ids"].astype(str))


def _save_npz(path: str, **arrays) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez_compressed(handle, **arrays)


def ulira_shadows(data: ImageData, settings: dict, n_shadows: int, seed: int, membership_path: str,
                  model_paths: list[str]) -> None:
    """U-LiRA's base shadow models (one file each) and their membership (with the image ids it refers to)."""
    if len(model_paths) != n_shadows:
        raise ValueError(f"{len(model_paths)} model paths for {n_shadows} shadows (config key "
                         "'recognizer.ulira.n_shadows')")
    membership, models = ulira.train_bases(data, settings, n_shadows, seed)
    for k, (model, path) in enumerate(zip(models, model_paths)):
        save_model(model, path, {"shadow": k})
    _save_npz(membership_path, membership=membership, ids=data.ids.astype(str))


def ulira_experiment(data_path: str, model_path: str, membership_path: str, shadow_paths: list[str], dataset: str,
                     name: str, rcfg: dict, seed: int) -> pd.DataFrame:
    """U-LiRA against every configured method of one random-subset experiment (``rcfg``: ``ulira.job_config``)."""
    data = ImageData.load(data_path)
    original, meta = load_model(model_path)
    with np.load(membership_path, allow_pickle=False) as z:
        if not np.array_equal(z["ids"], data.ids):
            raise ValueError(f"{membership_path} was made for a different image table; rerun recognizer_ulira_shadows")
        membership = z["membership"]
    bases = [load_model(p)[0] for p in shadow_paths]
    return ulira.attack_experiment(data, original, meta, membership, bases,
                                   Experiment.parse("random_subset", dataset, name), rcfg, seed)


def with_ulira(rows: pd.DataFrame, ulira_frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``rows`` with the U-LiRA columns ``ULIRA_COLUMNS`` joined in (NaN for rows U-LiRA did not attack)."""
    keys = ["task", "dataset", "experiment", "method", "setting"]
    attack = (pd.concat(ulira_frames, ignore_index=True)[[*keys, *ULIRA_COLUMNS]] if ulira_frames else
              pd.DataFrame(columns=[*keys, *ULIRA_COLUMNS]))
    return rows.merge(attack.astype({c: float for c in ULIRA_COLUMNS}), on=keys, how="left", validate="one_to_one")


def _load(data_path: str, model_path: str, shadows_path: str):
    data = ImageData.load(data_path)
    original, meta = load_model(model_path)
    with np.load(shadows_path, allow_pickle=False) as z:
        shadow = {k: z[k] for k in z.files}
    return data, original, meta, shadow


def experiment(data_path: str, model_path: str, shadows_path: str, task: str, dataset: str, name: str, rcfg: dict,
               seed: int, selection_path: str | None = None, tuned_path: str | None = None,
               paper_metrics_path: str | None = None) -> pd.DataFrame:
    """``rcfg``: the recognizer config, or the part of it this experiment reads (``runs.experiment_config``);
    ``selection_path``: the forget identity's selection file of a class-wise experiment (checked against the name).
    With ``tuned_path`` (the tuning protocol's chosen settings) the tuned methods run instead, and their speedup is
    taken against Retrain's CPU time in ``paper_metrics_path`` (the same experiment's paper-setting rows)."""
    exp = Experiment.parse(task, dataset, name)
    if selection_path is not None and read_json(selection_path)["forget_identity"] != exp.forget_identity:
        raise ValueError(f"{selection_path} is not the selection of forget identity {exp.forget_identity}")
    data, original, meta, shadow = _load(data_path, model_path, shadows_path)
    if tuned_path is None:
        return run_experiment(data, original, meta, shadow, exp, rcfg, seed)
    chosen = read_json(tuned_path).get(task, {}).get(dataset, {})
    rows = run_experiment(data, original, meta, shadow, exp, rcfg, seed, tuned=chosen)
    paper = pd.read_parquet(paper_metrics_path)
    retrain_seconds = paper.loc[paper["method"] == "retrain", "time_s"]
    reference = float(retrain_seconds.iloc[0]) if len(retrain_seconds) else float("nan")
    rows["speedup"] = [speedup(reference, t) for t in rows["time_s"]]
    return rows


def tuning_requests(data_path: str, model_path: str, shadows_path: str, task: str, dataset: str, rcfg: dict,
                    seed: int, selection_table: str | None = None) -> pd.DataFrame:
    """The tuning requests of one task and dataset with the original model's metrics on them (class-wise: the
    identities are drawn among those that are not forget identities of ``selection_table``)."""
    data, original, meta, shadow = _load(data_path, model_path, shadows_path)
    forget = pd.read_parquet(selection_table)["forget_identity"].tolist() if selection_table else []
    reqs = tuning.requests(rcfg, task, dataset, data, forget, seed)
    log.info("tuning requests %s %s: %s", task, dataset, ", ".join(e.name for e in reqs))
    return tuning.request_table(data, original, meta, shadow, reqs, rcfg, seed)


def tune(data_path: str, model_path: str, shadows_path: str, requests_path: str, method: str, rcfg: dict,
         seed: int) -> pd.DataFrame:
    """One method's whole grid on the tuning requests of ``requests_path``."""
    data, original, meta, shadow = _load(data_path, model_path, shadows_path)
    return tuning.tune_method(data, original, meta, shadow, pd.read_parquet(requests_path), method, rcfg, seed)


def tuning_tables(grid_paths: list[str], request_paths: list[str], rcfg: dict, out: dict) -> dict[str, pd.DataFrame]:
    """The protocol's tables: the requests, every setting's mean metrics with the rule's columns, and the choice per
    method with its reason; ``chosen.json`` feeds the tuned evaluation runs."""
    rows = pd.concat([pd.read_parquet(p) for p in grid_paths], ignore_index=True)
    reqs = pd.concat([pd.read_parquet(p) for p in request_paths], ignore_index=True)
    grid, choice = tuning.choose_all(rows, reqs, rcfg["tuning"]["rule"])
    write_csv(reqs, out["requests"])
    write_csv(rows.drop(columns=["info"]), out["runs"])
    write_csv(grid, out["grid"])
    write_csv(choice, out["choice"])
    write_json(tuning.chosen_settings(choice), out["chosen"])
    with atomic_path(out["choice_md"]) as tmp:
        tmp.write_text(tuning.choice_markdown(grid, choice, reqs, rcfg))
    return {"grid": grid, "choice": choice, "requests": reqs}


def tables(metric_paths: list[str], original_paths: list[str], out: dict,
           ulira_paths: list[str] = ()) -> dict[str, pd.DataFrame]:
    """Tidy metrics (deterministic), costs (times and speedups), summaries and the paper-style tables and plot;
    ``ulira_paths``: U-LiRA rows, joined on (task, dataset, experiment, method, setting) (NaN where not run)."""
    frames = [pd.read_parquet(p) for p in metric_paths]
    expected = [c for c in VALUE_COLUMNS if c not in ULIRA_COLUMNS]
    stale = [p for p, frame in zip(metric_paths, frames) if not set(expected) <= set(frame.columns)]
    if stale:  # written by an older version whose rows lack a metric (e.g. svm_asr); the rule cannot see that
        raise ValueError(f"{len(stale)} experiment file(s) lack metric columns this version writes, e.g. {stale[0]}; "
                         "rerun them: snakemake --forcerun recognizer_experiment recognizer_tuned_experiment ...")
    rows = with_ulira(pd.concat(frames, ignore_index=True), [pd.read_parquet(p) for p in ulira_paths])
    rows = rows.sort_values(["task", "dataset", "experiment", "method", "setting"], kind="stable")
    rows = rows.reset_index(drop=True)
    keys = ["task", "dataset", "experiment", "seed", "forget_identity", "method", "setting"]
    metrics = rows[[*keys, "n_retain", "n_forget", "n_test", *VALUE_COLUMNS, "settings", "info"]]
    costs = rows[[*keys, *COST_COLUMNS]]
    originals = pd.DataFrame([read_json(p) for p in original_paths])
    summary = summary_table(rows)
    rs, cw = random_subset_table(rows), classwise_table(rows)
    write_parquet(metrics, out["metrics"])
    write_csv(metrics, out["metrics_csv"])
    write_csv(costs, out["costs"])
    write_parquet(summary, out["summary"])
    write_csv(summary, out["summary_csv"])
    write_csv(originals.drop(columns=["model", "training"], errors="ignore"), out["originals"])
    for frame, csv_key, md_key, title in ((rs, "random_subset", "random_subset_md", "Random-subset forgetting"),
                                          (cw, "classwise", "classwise_md", "Class-wise forgetting (ORL identities)")):
        write_csv(frame, out[csv_key])
        with atomic_path(out[md_key]) as tmp:
            tmp.write_text(f"# {title}\n\nmean ± 95% Student-t half width over experiments (n); times are CPU "
                           "seconds of the unlearning (one thread), speedup = Retrain's CPU time / the method's. "
                           "'X' = the configured (paper) setting, 'X (tuned)' = the tuning protocol's choice "
                           "(tuning/choice.md). MIA rows: AUC/accuracy 0.5 = the forget set looks unseen; U-LiRA "
                           "(recognizer.ulira) attacks the configured settings of its seeds only, not the Original."
                           "\n\n" + markdown(frame))
    plot_speedup_vs_facc(rows, out["plot"])
    return {"metrics": metrics, "summary": summary, "random_subset": rs, "classwise": cw}


__all__ = ["set_threads", "orl_data", "fashion_mnist_data", "train_original", "shadows", "ulira_shadows",
           "ulira_experiment", "with_ulira", "experiment", "tuning_requests", "tune", "tuning_tables", "tables"]
