"""The cross-architecture build and test harness behind noxfile.py.

paths     every path the harness reads or writes
project   the project's name (from pyproject.toml) and the names made from it
targets   the target table of pyproject.toml, validated and frozen; each arch's other names
ladders   every level of each ladder selected by a run of the table, or proven elsewhere
host      Docker daemon, QEMU binfmt registration, apt packages
wheels    wheels for a target's images, downloaded on the host
images    base/test/build images, tagged by a hash of their inputs
tools     the host-side build tools (cibuildwheel, the build backend) and their pins
builders  the builders a target's row names, behind one interface (cross: cross.py)
build     the build every builder shares: staging, reuse, the auditwheel check, wheelhouse/
suite     the kernel suite per CPU model / ISA level in clean containers
verdict   the same tests on every run, proven from the JUnit reports
summary   the closing table (Markdown and JSON) from JUnit reports
records   the test records: written by a run, sealed by a digest, added from other machines
prove     a record from any Linux machine: the suite at every level its CPU has, no Docker
gate      every level a wheel ships proven by a passing run of its bytes
index     the index client: where to publish and what the index holds
publish   from tested wheels to an index, all or nothing
flows     the sessions' flows; native: the suite on the host per ISA level
"""
