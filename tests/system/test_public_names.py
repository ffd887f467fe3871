"""One name, one thing: no two public classes of durable_sse share a name.

Two classes named ``Event`` (the decoder's and the consumer's) made every reader of a
module that met both ask which one it was, and the simulation import them under aliases.
Read with ``ast`` (nothing is imported), so a new module cannot hide from it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "durable_sse"


def public_classes(package: Path) -> dict[str, list[str]]:
    """Each public class name of the package's modules -> the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(module)
    return found


def test_no_two_public_classes_share_a_name() -> None:
    shared = {
        name: modules for name, modules in public_classes(PACKAGE).items() if len(modules) > 1
    }
    assert not shared, f"public classes defined in more than one module: {shared}"


def test_the_check_sees_a_shared_name(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "a").mkdir(parents=True)
    (package / "a" / "model.py").write_text("class Event:\n    pass\n")
    (package / "b.py").write_text("class Event:\n    pass\n\n\nclass _Private:\n    pass\n")
    (package / "c.py").write_text("class _Private:\n    pass\n")
    assert public_classes(package)["Event"] == ["pkg.a.model", "pkg.b"]
    assert "_Private" not in public_classes(package)
