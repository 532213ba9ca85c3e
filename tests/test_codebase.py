"""The codebase stays easy to change: no module over 600 lines, no function over 80 lines or with more than 8
parameters (group them in a config dataclass), no module-level on/off switches in the model."""

from __future__ import annotations

import ast
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
