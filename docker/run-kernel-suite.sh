#!/bin/bash
# Runs in a test container, or natively in the venv of harness/proving/prove.py: installs
# the built wheel (never the source tree) and runs the kernel suite.
# Usage: run-kernel-suite.sh WHEEL REPORT_DIR [PYTEST_ARGS...]
# REPORT_DIR gets environment.json (environment.py), junit.xml, pytest.log (the
# suite's output, where the summary finds a crashed worker's signal) and whatever
# the tests write there: isa.txt, the kernel path moe_xarch selects under this CPU
# (tests/kernels/conftest.py).
set -euo pipefail

wheel=$1
report_dir=$2
shift 2

python -m pip install --quiet --no-index --no-deps "$wheel"
# --no-deps keeps the image's torch; pip check still fails on a wrong torch pin.
python -m pip check
# For the test record: the levels the library carries, torch, the OS, the CPU. A
# library that cannot load fails the suite below, which names how; not here.
python "$(dirname "$0")/environment.py" moe_xarch "$report_dir/environment.json" ||
    echo "run-kernel-suite.sh: environment.py failed; the record takes another run's account" >&2
export MOE_XARCH_REPORT_DIR=$report_dir
# A crashed process under QEMU would otherwise write a core of the emulated guest.
ulimit -c 0
# xunit1: each test's file in the report (harness/plan/verdict.py). A crashed xdist worker
# ends the run at once (by default xdist restarts up to 4 per worker, each importing
# torch again, minutes under QEMU, to crash on the next test); faulthandler names
# the signal in the output.
python -m pytest tests/kernels -p no:cacheprovider -o junit_family=xunit1 --max-worker-restart=0 \
    --junitxml="$report_dir/junit.xml" "$@" 2>&1 | tee "$report_dir/pytest.log"
