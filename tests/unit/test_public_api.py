"""The public API is one import, and the folder tree says where things are."""

from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path

import backends
import partitioner


def test_the_api_the_readme_names_imports_from_the_package() -> None:
    from partitioner import (  # noqa: F401 - the import is the test
        DeviceSet, Plan, from_graph_module, from_module, load_profile, partition, partition_outcome,
    )

    assert callable(partition) and callable(partition_outcome)
    assert inspect.isclass(Plan) and inspect.isclass(DeviceSet)
    assert inspect.signature(partition).parameters.keys() == inspect.signature(partition_outcome).parameters.keys()


def test_every_exported_name_is_listed_in_the_package_docstring_or_all() -> None:
    for name in partitioner.__all__:
        assert hasattr(partitioner, name), f"partitioner.__all__ names {name}, which it does not define"
    for name in ("partition", "partition_outcome", "Plan", "load_profile", "DeviceSet", "from_module",
                 "from_graph_module"):
        assert f"``{name}``" in (partitioner.__doc__ or ""), f"help(partitioner) does not list {name}"


def test_no_module_shares_its_name_with_an_exported_function() -> None:
    for package in (partitioner, backends):
        modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
        functions = {name for name in getattr(package, "__all__", ()) if inspect.isfunction(getattr(package, name))}
        assert not modules & functions, f"{package.__name__}: modules and functions share names {modules & functions}"


def test_every_backend_implements_the_interface() -> None:
    for name in backends.BACKENDS:
        backend = backends.get_backend(name)
        assert isinstance(backend, backends.Backend), name
        assert backend.name == name and backend.runs
        assert f"``{name}``" in (backends.__doc__ or ""), f"the backends docstring does not list {name}"


def test_the_readme_layout_table_matches_the_tree() -> None:
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
               and (p / "__init__.py").exists() or p.name in ("tests", "bench")}
    listed = {line.split("`")[1].rstrip("/") for line in layout.splitlines() if line.startswith("| `")}
    assert listed == folders
    for package in ("partitioner", "backends"):
        for entry in (root / package).iterdir():
            if entry.name.startswith("_") or entry.suffix not in (".py", ""):
                continue
            name = entry.name if entry.suffix == ".py" else entry.name + "/"
            assert f"`{name}`" in layout or f"`{package}/{name}`" in layout, \
                f"the README's layout table does not mention {package}/{name}"
