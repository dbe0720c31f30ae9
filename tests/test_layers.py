"""The package's import graph: no circle, and every arrow points down the declared layer order.

Each source file's imports (module-level and lazy ones inside functions alike)
are read with ``ast``. A module may import modules of a lower layer, and the
modules of its own package (a folder listed as one unit); two units of the same
layer never import each other. docs/design.md draws the same picture, with these layer numbers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# lowest first; a unit is a module or a package (all of it)
LAYERS: list[list[str]] = [
    ["trit.errors", "trit.cache"],
    ["trit.format", "trit.corpora", "trit.compressed"],
    ["trit.checkpoint", "trit.ggml"],  # trit's files; GGUF's ternary blocks
    ["trit.arch", "trit.smollm2", "trit.gguf_file"],
    ["trit.quant", "trit.kernels.reference", "trit.kernels.cpu", "trit.kernels.cpu_native", "trit.kernels.tuning"],
    ["trit.rotation", "trit.configs"],  # the rotation's checkpoint glue; the typed configs of every scheme
    ["trit.kernels.triton"],
    ["trit.kernels.cuda"],
    ["trit.kernels.registry", "trit.kernels.int8_rows", "trit.kernels"],  # the package's own __init__: a docstring
    ["trit.ops"],
    ["trit.linear"],  # the one layer object: runtime, transformers and vLLM hold and run a layer through it
    ["trit.nn", "trit.vllm"],
    ["trit.runtime", "trit.synthetic", "trit.calibrate", "trit.hf"],
    ["trit.convert", "trit.w4a8"],
    ["trit.import_bitnet", "trit.import_gguf", "trit.import_trilm", "trit.export_gguf", "trit.heal", "trit.api"],
    ["trit.eval"],
    ["trit.bench"],
    ["trit.demo"],
    ["trit.cli"],
    ["trit", "trit.__main__"],
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every ``trit`` module the file imports, resolved to full names."""
    known = {_module_name(p) for p in SRC.rglob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: relative import; the package imports absolutely"
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            # ``from trit.kernels import tuning`` imports trit.kernels.tuning (its package only as a parent)
            out |= subs if subs else {node.module or ""}
    return {name for name in out if name in known}


def _unit(module: str) -> tuple[int, str]:
    """The layer index and unit of a module: the longest unit that is it or holds it."""
    best = None
    for i, layer in enumerate(LAYERS):
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (i, unit)
    assert best is not None, f"{module} is in no layer of LAYERS: add it"
    return best


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p, _module_name(p)) for p in sorted(SRC.rglob("*.py"))}


def test_every_import_points_down_the_layers() -> None:
    wrong = []
    for module, imported in _graph().items():
        layer, unit = _unit(module)
        for target in imported:
            t_layer, t_unit = _unit(target)
            if t_unit == unit or (module == "trit" or target == "trit"):
                continue  # inside one unit; the top package's __init__ only re-exports
            if t_layer >= layer:
                wrong.append(f"{module} (layer {layer}) imports {target} (layer {t_layer})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or nxt == "trit" or node == "trit":
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_vllm_plugin_stands_on_format_checkpoint_arch_and_the_layer_object() -> None:
    # and the int8 output layer's product, which the plugin's head method calls as the runtime's module does
    allowed = ("trit.format", "trit.checkpoint", "trit.arch", "trit.linear", "trit.errors", "trit.vllm",
               "trit.kernels.int8_rows")
    for module, imported in _graph().items():
        if module.startswith("trit.vllm"):
            extra = sorted(t for t in imported if not t.startswith(allowed) and t != "trit")
            assert not extra, f"{module} imports {extra}"


def _defined_in(path: Path) -> set[str]:
    """The names a module defines itself (functions, classes, assigned names), not those it imports."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def test_no_module_reaches_kernel_internals_through_ops() -> None:
    """``trit.ops`` defines the custom ops; whatever else it imports is its own business, never a re-export."""
    ops_names = _defined_in(SRC / "trit" / "ops.py")
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "trit.ops":
                wrong += [f"{_module_name(path)}: from trit.ops import {a.name}" for a in node.names
                          if a.name not in ops_names]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                  and isinstance(node.value.value, ast.Name) and node.value.value.id == "trit"
                  and node.value.attr == "ops" and node.attr not in ops_names):
                wrong.append(f"{_module_name(path)}: trit.ops.{node.attr}")
    assert not wrong, "kernel internals reached through trit.ops:\n" + "\n".join(wrong)
    assert "noqa: F401" not in (SRC / "trit" / "ops.py").read_text()  # no re-export kept alive for others


def test_every_load_path_reaches_the_kernels_through_the_layer_object() -> None:
    """The runtime's layer, transformers' quantizer (through the runtime's prepare) and the vLLM plugin hold and
    run a ternary layer through trit.linear; none of them calls the ops or the kernels' layouts itself."""
    for module in ("trit.nn", "trit.vllm.config", "trit.hf", "trit.runtime.loader"):
        path = SRC / Path(*module.split(".")).with_suffix(".py")
        imported = _imports(path, module)
        assert not any(t == "trit.ops" or t.startswith("trit.kernels.cuda") or t == "trit.kernels.registry"
                       for t in imported), f"{module} imports {sorted(imported)}"
    graph = _graph()
    assert "trit.linear" in graph["trit.nn"] and "trit.linear" in graph["trit.vllm.config"]
    assert "trit.nn" in graph["trit.hf"] and "trit.nn" in graph["trit.runtime.loader"]


def test_the_design_docs_layer_table_is_this_files() -> None:
    """docs/design.md draws the layers this test checks: the same modules on the same rows."""
    text = (SRC.parent / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \|", text, re.M)
    drawn = [sorted("trit." + m.strip("`").rstrip("/").replace("/", ".") for m in cells.split(", "))
             for _, cells in rows]
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    assert drawn == [sorted(layer) for layer in LAYERS[:-1]]  # the top package's __init__ is not drawn
