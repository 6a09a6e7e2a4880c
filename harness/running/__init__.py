"""The ONE kernel suite against a built wheel, run as the plan says.

suite     the kernel suite per CPU model / ISA level in clean containers
native    the suite on the host per ISA level (nox -s kernels)
coverage  line and branch coverage of the kernels, per kernel file and ISA level (nox -s coverage)
"""
