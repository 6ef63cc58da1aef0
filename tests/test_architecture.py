"""Architecture: imports flow one way, core <- data <- models <- {inject, unlearn, metrics} <- analysis <- pipeline,
with no cycles; pipeline holds its three concerns as sub-packages (stages, orchestration, presentation)."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lume_lab"
LAYER = {"core": 0, "data": 1, "models": 2, "inject": 3, "unlearn": 3, "metrics": 3, "analysis": 4, "pipeline": 5}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    "Every lume_lab module `path` imports, at module level or inside functions (lazy imports count)."
    mod = _module_name(path)
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("lume_lab")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else: name = node.module or ""
            if not name.startswith("lume_lab"): continue
            # `from lume_lab.metrics import rouge` imports the submodule
            subs = [
                f"{name}.{a.name}"
                for a in node.names
                if (PKG.parent / f"{name}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
            ]
            out |= set(subs) or {name}
    return out


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PKG.rglob("*.py") if p.name != "_modidx.py"}


def _area(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else None


def test_every_area_has_a_layer():
    # presets/: data
    areas = {p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("_") and any(p.glob("*.py"))}
    assert areas <= set(LAYER), f"areas without a layer: {areas - set(LAYER)}"


def test_imports_flow_one_way():
    bad = []
    for mod, deps in _graph().items():
        a = _area(mod)
        if a is None: continue
        for d in deps:
            b = _area(d)
            if b is None or b == a: continue
            if LAYER[b] >= LAYER[a]:   # upward, or sideways between inject / unlearn / metrics
                bad.append(f"{mod} -> {d}")
    assert not bad, (
        "imports against the layer order core <- data <- models <- {inject, unlearn, metrics} <- analysis <- "
        "pipeline:\n  "
        + "\n  ".join(sorted(bad))
    )


def test_no_import_cycles():
    g = _graph()
    state, stack, cycles = {}, [], []
    def visit(m):
        state[m] = 1; stack.append(m)
        for d in sorted(g.get(m, ())):
            if d not in g: continue
            if state.get(d) == 1: cycles.append(stack[stack.index(d):] + [d])
            elif d not in state: visit(d)
        stack.pop(); state[m] = 2
    for m in sorted(g):
        if m not in state: visit(m)
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


def test_checker_sees_lazy_and_relative_imports(tmp_path):
    "The walker itself: a lazy relative import inside a function is found (so the tests above could fail)."
    src = PKG / "core" / "_probe_for_test.py"
    try:
        src.write_text("def f():\n    from ..pipeline.orchestration import cli\n    from lume_lab.data.pii import x\n")
        assert {"lume_lab.pipeline.orchestration.cli", "lume_lab.data.pii"} <= _imports(src)
    finally:
        src.unlink()


PIPELINE_CONCERNS = {"stages", "orchestration", "presentation"}


def test_pipeline_is_three_concerns():
    "lume_lab/pipeline/ holds only its __init__ and one sub-package per concern, and the walker sees inside them."
    pipe = PKG / "pipeline"
    entries = {p.name for p in pipe.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py"} | PIPELINE_CONCERNS, (
        f"stray entries in lume_lab/pipeline/: {sorted(entries - {'__init__.py'} - PIPELINE_CONCERNS)}"
    )
    assert all((pipe / c / "__init__.py").exists() for c in PIPELINE_CONCERNS)
    g = _graph()
    for c in PIPELINE_CONCERNS: assert any(m.startswith(f"lume_lab.pipeline.{c}.") for m in g), c
    # three levels up from a concern's module is the package root: `from ...core.store import RunStore`
    assert (
        "lume_lab.core.store" in g["lume_lab.pipeline.stages.base"]
        and "lume_lab.pipeline.stages.base" in g["lume_lab.pipeline.stages.testbed"]
    )
