"""Safe loading and atomic writing, checked over the source and by behaviour.

Weights and states are read only as safetensors or with torch.load(weights_only=True); nothing is unpickled. Every
output is written under a temporary name and renamed (idunlearn.io.atomic_path), so no stage leaves a half-written
output behind."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO
from idunlearn.config import run_config, validate_config
from idunlearn.io import atomic_path, write_json

SOURCES = sorted([*(REPO / "src" / "idunlearn").rglob("*.py"), *(REPO / "workflow" / "scripts").rglob("*.py")])


def _calls(name: str):
    """(file, call node) of every call whose function is ``name`` or ``<anything>.name``."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Attribute) and func.attr == name) or (
                        isinstance(func, ast.Name) and func.id == name):
                    yield path.relative_to(REPO), node


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else kw.value
    return None


def test_every_torch_load_is_weights_only():
    loads = [(path, call) for path, call in _calls("load")
             if isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) == "torch"]
    assert len(loads) >= 2, "the resume-state loaders (unlearning runner, generator training) were not found"
    unsafe = [f"{path}:{call.lineno}" for path, call in loads if _keyword(call, "weights_only") is not True]
    assert not unsafe, f"torch.load without weights_only=True: {unsafe}"


def test_nothing_is_unpickled():
    imports = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            imports += [(path, n) for n in names if n.split(".")[0] in {"pickle", "dill", "cloudpickle", "joblib",
                                                                            "shelve", "marshal"}]
    assert not imports, imports
    assert not list(_calls("read_pickle")) and not list(_calls("to_pickle"))
    np_loads = [(path, call) for path, call in _calls("load")
                if isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) in {"np", "numpy"}]
    assert np_loads, "no np.load found: the check below would be vacuous"
    assert all(_keyword(call, "allow_pickle") in (None, False) for _, call in np_loads)  # numpy's default: False


class _Payload:
    """Unpickling this would create ``marker``: the loaders must refuse it instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _poisoned(path: Path, marker: Path, **tensors) -> Path:
    torch.save({**tensors, "payload": _Payload(marker)}, path)
    return path


def test_a_resume_state_holding_code_is_refused_not_run(tmp_path):
    from idunlearn.models.mini import build_mini_generator
    from idunlearn.unlearning import build_method
    from idunlearn.unlearning.base import UnlearningData
    from idunlearn.unlearning.runner import unlearn

    tiny = {"image_size": 8, "text_width": 32, "text_heads": 2, "block_out_channels": [32, 32, 32, 32],
            "layers_per_block": 1}
    run = {**run_config(validate_config({}), "piu"), "steps": 2, "checkpoint_every": 1}
    state = _poisoned(tmp_path / "state.pt", tmp_path / "ran", trainable={}, step=1)
    rng = np.random.default_rng(0)
    data = UnlearningData(*(rng.standard_normal(s).astype(np.float32) for s in ((3, 16), (6, 16), (16,))))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        unlearn(build_mini_generator(tiny), build_method("piu", run), data, run, state, seed=0)
    assert not (tmp_path / "ran").exists()


def test_hub_checkpoints_that_are_not_safetensors_load_weights_only(tmp_path):
    """The Arc2Face encoder is a pytorch_model.bin at the pinned revision: transformers and diffusers read such files
    with torch.load(weights_only=True), so a checkpoint holding code fails to load instead of running it."""
    from diffusers.models.model_loading_utils import load_state_dict as diffusers_load
    from transformers.modeling_utils import load_state_dict as transformers_load

    for name, load in (("transformers", transformers_load), ("diffusers", diffusers_load)):
        marker = tmp_path / f"ran_{name}"
        path = _poisoned(tmp_path / f"{name}_pytorch_model.bin", marker, weight=torch.zeros(2))
        with pytest.raises(Exception) as info:
            load(str(path))
        chain, error = [], info.value
        while error is not None:
            chain.append(error)
            error = error.__cause__ or error.__context__
        assert any(isinstance(e, pickle.UnpicklingError) and "Weights only" in str(e) for e in chain), (name, chain)
        assert not marker.exists(), name


def _inside_atomic_path(stack) -> bool:
    return any(isinstance(node, ast.With) and any(
        isinstance(item.context_expr, ast.Call) and ast.unparse(item.context_expr.func).endswith("atomic_path")
        for item in node.items) for node in stack)


# calls that write a file, by function name; ".save" only where the object is torch or an image
_WRITERS = {"to_parquet", "to_csv", "to_json", "savefig", "savez", "savez_compressed", "save_file", "write_text",
            "write_bytes"}
# the only writes that are not outputs: a stage's log (streamed while the stage runs) and a /proc control file
_NOT_OUTPUTS = {("src/idunlearn/runlog.py", "open"), ("src/idunlearn/benchmarks.py", "open"),
                ("workflow/scripts/recognizer_data.py", "save")}  # ImageData.save: atomic, checked by this scan


def test_every_output_is_written_under_a_temporary_name():
    atomic, direct = 0, []
    for path in SOURCES:
        rel = path.relative_to(REPO).as_posix()

        def visit(node, stack):
            nonlocal atomic
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                mode = node.args[1] if name == "open" and len(node.args) > 1 else _keyword(node, "mode")
                opens_for_writing = (name == "open" and isinstance(mode, ast.Constant)
                                     and bool(set(str(mode.value)) & set("wax")))
                if name in _WRITERS or name == "save" or opens_for_writing:
                    if _inside_atomic_path(stack):
                        atomic += 1
                    elif (rel, name) not in _NOT_OUTPUTS:
                        direct.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
            for child in ast.iter_child_nodes(node):
                visit(child, [*stack, node])

        visit(ast.parse(path.read_text()), [])
    assert atomic >= 10, f"only {atomic} writes found inside atomic_path: the scan is broken"
    assert not direct, "outputs written in place (use idunlearn.io.atomic_path or its writers):\n" + "\n".join(direct)


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    write_json({"v": 1}, target)
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"v": 2, "trunc')  # half written, then the stage dies
            raise RuntimeError("killed")
    assert target.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
