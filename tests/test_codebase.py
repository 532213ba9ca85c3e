"""The codebase stays easy to change: no module over 600 lines, no function over 80 lines or with more than 8
parameters (group them in a config dataclass), no module-level on/off switches in the model; imports run down the
layers, with no cycles, no other module's private names and no function-local import that does not say why.
`python tests/test_codebase.py` prints the import counts."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertkit"
FILES = sorted(SRC.rglob("*.py"))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_module_and_function_sizes(path):
    text = path.read_text()
    assert text.count("\n") <= 600, f"{path.name}: {text.count(chr(10))} lines (split it by concern)"
    for fn in _functions(ast.parse(text)):
        length = fn.end_lineno - fn.lineno + 1
        a = fn.args
        params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
        assert length <= 80, f"{path.name}:{fn.lineno} {fn.name} is {length} lines"
        assert len(params) <= 8, f"{path.name}:{fn.lineno} {fn.name} takes {len(params)} parameters"


def test_model_has_no_switches_or_ambient_checks():
    """model.py is the maths: no module-level constants that switch paths, no reads of torch's global state."""
    text = (SRC / "model.py").read_text()
    for needle in ("is_grad_enabled", "is_autocast_enabled", "is_tracing", "is_compiling", "device.type", "mkldnn"):
        assert needle not in text, needle
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            assert names == ["__all__"], f"module-level assignment {names} in model.py"


def test_model_inputs_are_laid_out_by_the_tokenizer_only():
    """[CLS] / [SEP] placement, token types and attention masks are written in tokenizer/ (inputs.py) alone: other
    modules call it instead of assembling rows themselves."""
    import re
    assembling = re.compile(r"\[\s*(?:\w+\.)?cls_(?:token_)?id\s*(?:\]|,\s*\*)"    # [cls] ...  /  [cls, *a, ...
                            r"|\[\s*(?:\w+\.)?sep_(?:token_)?id\s*\]"              # ... + [sep]
                            r"|attention_mask\s*=\s*torch\.ones_like")
    offenders = []
    for path in FILES:
        if path.parent.name == "tokenizer":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if assembling.search(line.split("#")[0]):
                offenders.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not offenders, "model inputs assembled outside tokenizer/inputs.py:\n" + "\n".join(offenders)


# ---------------------------------------------------------------------------------------------- imports
# The layers, bottom to top, in the order data flows (docs/architecture.md): a module imports from its own layer or
# below. Runtime and checkpoint sit under the model, as transformers' modeling_utils and quantizers sit under its
# model files: the model's from_pretrained loads through them, and they know the model's modules by their names.
LAYERS = [
    ["", "errors", "atomic", "progress", "textfiles", "options", "hub", "datasets", "protobuf"],   # "": bertkit/__init__.py
    ["families", "disentangled", "config", "hardware"],
    ["tokenizer", "vocab"],
    ["attention", "padding", "activations", "outputs", "compat", "modern"],
    ["runtime", "precision"],
    ["checkpoint"],
    ["model"],
    ["heads", "auto", "tf_checkpoint"],
    ["predict"],                        # the inference engine: inputs, the forward loop, the heads' decoders
    ["pretraining"],
    ["optim", "train", "plots"],
    ["tasks", "embed", "distill", "distill_mlm"],
    ["infer", "fillmask_eval", "rerank", "pipelines", "quantize", "export"],
    ["serve"],
    ["demo", "commands", "cli", "__main__"],
]
# A function-local import of a bertkit module says why it waits, on its line or on a comment just above its run of
# imports: an optional dependency (fastapi, onnx, matplotlib, ...) or torch / numpy kept off `bertkit -h`'s path.
DEFERRED_MARK = "# deferred:"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in FILES}


def _layer(module: str) -> int:
    rest = module.split(".", 1)[1] if "." in module else ""
    top = rest.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: name its layer in LAYERS")


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`: runs only when the module is the program, never on import."""
    t = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(t, ast.Compare) and isinstance(t.left, ast.Name)
            and t.left.id == "__name__")


@functools.cache
def imports() -> list[tuple[str, str, str | None, int, bool, str]]:
    """Every import of a bertkit module: (importer, imported module, name or None, line, function-local?, line text).
    `from bertkit.a import b` names module bertkit.a.b where that is a module, else name b of bertkit.a."""
    found = []
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()

        def visit(node: ast.AST, local: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if _is_main_guard(child):
                    continue
                inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(child, ast.Import):
                    targets = [(a.name, None) for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                        base = ".".join(pkg[:len(pkg) - child.level + 1] + ([base] if base else []))
                    targets = [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in MODULES else (base, a.name)
                               for a in child.names]
                for target, name in targets:
                    if target.split(".")[0] == "bertkit":
                        found.append((module, target, name, child.lineno, local, lines[child.lineno - 1]))
                visit(child, inner)

        visit(ast.parse(text), False)
    return found


def _edges() -> dict[str, set[str]]:
    """Who imports whom on import; importing a.b.c also runs a and a.b, unless the importer is inside them."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for src, target, *_ in imports():
        parts = target.split(".")
        for i in range(2, len(parts) + 1):
            pkg = ".".join(parts[:i])
            if pkg != src and not src.startswith(pkg + "."):
                graph[src].add(pkg)
    return graph


def cycles() -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    graph, index, low, stack, on, out = _edges(), {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while not group or v not in group:
                group.add(stack.pop())
            on.difference_update(group)
            if len(group) > 1:
                out.append(frozenset(group))

    for v in graph:
        if v not in index:
            connect(v)
    return out


def upward() -> list[str]:
    return sorted({f"{src}:{line} imports {target}" for src, target, _, line, _, _ in imports()
                   if _layer(target) > _layer(src)})


def private() -> list[str]:
    return [f"{src}:{line} imports {name} from {target}" for src, target, name, line, _, _ in imports()
            if name and name.startswith("_") and not name.startswith("__") and target != src]


def local_imports() -> list[str]:
    """Function-local imports of bertkit modules that do not say why they wait: a `# deferred: why` comment on the
    line, or on a comment line just above the run of imports it belongs to."""
    return [f"{src}:{line}: {text.strip()}" for src, _, _, line, local, text in imports()
            if local and not _says_why(MODULES[src].read_text().splitlines(), line)]


def _says_why(lines: list[str], line: int) -> bool:
    n = line - 1
    while n >= 0 and lines[n].strip().startswith(("from ", "import ")) and DEFERRED_MARK not in lines[n]:
        n -= 1
    return n >= 0 and DEFERRED_MARK in lines[n] and lines[n].strip().startswith(("#", "from ", "import "))


def test_no_import_cycles():
    found = cycles()
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_imports_run_down_the_layers():
    found = upward()
    assert not found, "imports from a higher layer (move the code to where it belongs):\n" + "\n".join(found)


def test_no_imports_of_another_modules_private_names():
    found = private()
    assert not found, "private names imported across modules (make them public or move them):\n" + "\n".join(found)


def test_function_local_imports_say_why():
    found = local_imports()
    assert not found, ("function-local imports of bertkit modules (import at the top, or say why it waits with "
                       f"`{DEFERRED_MARK} ...`):\n" + "\n".join(found))


if __name__ == "__main__":          # python tests/test_codebase.py: the counts, for a before / after
    local = [(s, line) for s, _, _, line, is_local, _ in imports() if is_local]
    print(f"import cycles: {len(cycles())}  {[sorted(c) for c in cycles()]}")
    print(f"upward imports: {len(upward())}")
    print(f"cross-module private imports: {len(private())}")
    print(f"function-local bertkit imports: {len(set(local))} statements, {len(local_imports())} without a reason")
    for title, entries in (("upward", upward()), ("private", private()), ("local", local_imports())):
        counts: dict[str, int] = {}
        for e in entries:
            counts[e.split(":")[0]] = counts.get(e.split(":")[0], 0) + 1
        print(f"{title} by file: {dict(sorted(counts.items(), key=lambda kv: -kv[1]))}")
