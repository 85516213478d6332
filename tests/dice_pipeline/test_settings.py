"""Every environment variable is read through dice_pipeline/settings.py, and the repository root is found one way
(dice_pipeline.paths.source_root): no other module spells a variable's name or computes the root itself."""

import ast
from pathlib import Path

from dice_pipeline import paths, settings

ROOT = Path(__file__).resolve().parents[2]
CODE = ["dice_pipeline", "assets", "warehouse", "training", "benchmarks"]


def _modules():
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "seed_corpus/pairs" not in path.as_posix():
                yield path, ast.parse(path.read_text(), filename=str(path))


def test_no_module_but_settings_spells_an_environment_variable():
    names = {variable.name for variable in settings.SETTINGS + settings.CHANNELS}
    spelled = []
    for path, tree in _modules():
        if path == ROOT / "dice_pipeline" / "settings.py":
            continue
        spelled += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value in names]
    assert spelled == []


def test_every_dice_variable_read_anywhere_is_declared():
    # a `DICE_*` name passed to os.environ / os.getenv outside settings.py would be a setting nobody declared
    reads = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = ast.unparse(node.func.value)
                if (target == "os.environ" or ast.unparse(node.func) == "os.getenv") and any(
                        isinstance(arg, ast.Constant) and str(arg.value).startswith("DICE_") for arg in node.args):
                    reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"
                    and isinstance(node.slice, ast.Constant) and str(node.slice.value).startswith("DICE_")):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reads == []


def test_the_repository_root_is_found_one_way():
    others = []
    for path, tree in _modules():
        if path.parent.name == "benchmarks":
            continue  # scripts find their checkout before they can import anything (sys.path)
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Assign, ast.FunctionDef, ast.Call)) else ""
            if (isinstance(node, ast.Assign) and "REPO_ROOT" in text) or \
                    (isinstance(node, ast.FunctionDef) and node.name in ("_repo_root", "repo_root")) or \
                    (isinstance(node, ast.Call) and "find_spec('training')" in text):
                others.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert others == []
    assert paths.source_root() == ROOT and paths.project_root() == ROOT  # a checkout (it has workspace.yaml)


def test_settings_are_read_when_used(monkeypatch, tmp_path):
    monkeypatch.setenv("DICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DICE_WAREHOUSE_PATH", "")  # empty = unset: the default
    assert paths.cache_dir() == tmp_path / "cache"
    assert paths.warehouse_path() == ROOT / "warehouse" / "dice.duckdb"


def test_a_channel_is_taken_once(monkeypatch):
    monkeypatch.setenv(settings.RUN_LIMIT_FD.name, "7")
    assert settings.RUN_LIMIT_FD.take() == "7" and settings.RUN_LIMIT_FD.take() is None
