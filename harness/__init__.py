"""The cross-architecture build and test harness behind noxfile.py.

targets   the target table of pyproject.toml, validated and frozen
host      Docker daemon, QEMU binfmt registration, apt packages
wheels    wheels for a target's images, downloaded on the host
images    base/test/build images, tagged by a hash of their inputs
build     cibuildwheel per target, wheels published atomically
suite     the kernel suite per CPU model / ISA level in clean containers
summary   the closing table (Markdown and JSON) from JUnit reports
flows     the sessions' flows; native: the suite on the host per ISA level
"""
