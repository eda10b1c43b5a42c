"""Checks of an installed wheel, run by .ci/check-package from outside the checkout.

1. The wheel's only top-level import name is ``mmagent``.
2. Every ``.py`` file of the source folders that pyproject.toml maps into the package (mmagent/, toolbox/, eval/,
   training/, demo/) is in the wheel at its mapped place, and so is the package data.
3. Every module of the installed package imports, from the installed copy (not the checkout).

Usage: python .ci/check_package.py REPO WHEEL
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import tomllib
import zipfile
from pathlib import Path


def fail(message: str) -> None:
    print(f"check-package: {message}", file=sys.stderr)
    sys.exit(1)


def main(repo: Path, wheel: Path) -> None:
    setuptools = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools["package-dir"]
    names = set(zipfile.ZipFile(wheel).namelist())

    tops = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    if tops != {"mmagent"}:
        fail(f"the wheel exposes {sorted(tops)}, not only 'mmagent'")

    missing = []
    for package, folder in package_dir.items():
        for source in sorted((repo / folder).rglob("*.py")):
            relative = source.relative_to(repo / folder)
            if "__pycache__" in relative.parts:
                continue
            # a folder mapped to another package is checked under that package
            if any(other != package and other.startswith(package + ".")
                   and (repo / package_dir[other]) in source.parents for other in package_dir):
                continue
            installed = "/".join([*package.split("."), *relative.parts])
            if installed not in names:
                missing.append(f"{source.relative_to(repo)} -> {installed}")
    for package, patterns in setuptools.get("package-data", {}).items():
        folder = repo / package_dir[package]
        for pattern in patterns:
            for data in folder.glob(pattern):
                installed = "/".join([*package.split("."), *data.relative_to(folder).parts])
                if data.is_file() and installed not in names:
                    missing.append(f"{data.relative_to(repo)} -> {installed}")
    if missing:
        fail("files missing from the wheel (add their package to [tool.setuptools] packages):\n  "
             + "\n  ".join(missing))

    import mmagent

    where = Path(mmagent.__file__).resolve().parent
    if repo in where.parents or where == repo / "mmagent":
        fail(f"mmagent was imported from the checkout ({where}), not from the installed wheel")
    modules = ["mmagent"] + [m.name for m in pkgutil.walk_packages(mmagent.__path__, "mmagent.")
                             if not m.name.endswith(".__main__")]  # running it would start the CLI
    for name in modules:
        module = importlib.import_module(name)
        origin = Path(module.__file__).resolve()
        if where not in origin.parents and origin.parent != where:
            fail(f"{name} was imported from {origin}, outside the installed package {where}")
    print(f"check-package: {wheel.name}: one import name (mmagent), {len(modules)} modules, all imported from "
          f"{where}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
