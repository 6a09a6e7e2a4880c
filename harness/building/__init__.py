"""Each target's wheel, by the builders its row names, into wheelhouse/.

versioning  the project's version, from git tags (setuptools-scm)
toolchain   cibuildwheel in the emulated build image, with a compiler that runs natively
cross       the cross toolchain: the host's compiler against the target's torch (coverage and drift proofs too)
builders    the builders a target's row names, behind one interface
build       the build every builder shares: staging, reuse, the auditwheel check, wheelhouse/
"""
