"""Every path in one place, the project's name read from one place."""

from __future__ import annotations

import ast
import tomllib

from harness.common import paths, project


def test_every_path_is_in_the_repository(repo_root):
    assert paths.REPO == repo_root and paths.PYPROJECT.is_file() and paths.DOCKER.is_dir()
    for name in dir(paths):
        value = getattr(paths, name)
        if name.isupper() and name != "REPO":
            assert value.is_relative_to(repo_root), name


def test_no_other_harness_module_works_out_where_the_repository_is(repo_root):
    for module in sorted((repo_root / "harness").rglob("*.py")):
        if module.name != "paths.py":
            assert "__file__" not in module.read_text(), module.name


def test_the_names_come_from_pyprojects_project_name(repo_root):
    name = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["name"]
    assert project.NAME == name == "moe-xarch"
    assert (project.PACKAGE, project.ENV_PREFIX, project.TABLE) == ("moe_xarch", "MOE_XARCH", "tool.moe-xarch")
    assert (repo_root / "package" / project.PACKAGE / "__init__.py").is_file()
    ast.parse(project.SUPPORTED_ISAS)



def test_no_harness_module_but_project_spells_the_name_in_code(repo_root):
    """Docstrings and comments may say it; code takes it from harness/common/project.py."""
    spelled: dict[str, list[str]] = {}
    for module in sorted((repo_root / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" not in node.value:
                if any(word in node.value.lower() for word in ("moe-xarch", "moe_xarch")):
                    spelled.setdefault(module.name, []).append(f"{node.lineno}: {node.value}")
    assert not spelled, spelled
