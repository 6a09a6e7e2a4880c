"""The cross-architecture build and test harness behind noxfile.py, one sub-package per stage.

A stage imports only the stages above it; common/ imports none.

common      what every stage uses: paths, the project's name, errors, console output
plan        the target table and the plan made from it: each target's runs, the tests each run runs
setup       the host (Docker, QEMU, apt), the wheels for the images, the images, the host's tools
building    each target's wheel, by the builders its row names, into wheelhouse/
running     the kernel suite against a built wheel: in clean containers, natively, under coverage
proving     what the runs proved, kept: the summary, the test records, every shipped level proven
publishing  from proven wheels to an index, all or nothing

flows       the sessions' flows (build, test, matrix): setup to proving, stage by stage
gha         the GitHub Actions matrix, generated from the target table
requirements-host.txt  the pins of the host's own tools (setup/tools.py)
"""
