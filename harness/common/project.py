"""The project's name, read once from pyproject.toml's [project] name, and the
names the harness derives from it (images, labels, containers, variables)."""

from __future__ import annotations

import re
import tomllib

from harness.common.paths import PYPROJECT

NAME = tomllib.loads(PYPROJECT.read_text())["project"]["name"]  # the distribution, as pip names it
PACKAGE = re.sub(r"[-.]+", "_", NAME).lower()  # the import package; wheel and sdist file names
ENV_PREFIX = PACKAGE.upper()  # of the package's own environment variables: MOE_XARCH_ISA, ...
TABLE = f"tool.{NAME}"  # the harness's table in pyproject.toml

# Asked of an installed package: every ISA level it can run on this CPU.
SUPPORTED_ISAS = f"import {PACKAGE}; print(*{PACKAGE}.supported_isas())"

