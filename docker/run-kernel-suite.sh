#!/bin/bash
# Runs inside a test container: installs the built wheel (never the source
# tree), records the kernel path moe_kernels selects under this CPU, and runs
# the kernel suite. Usage: run-kernel-suite.sh WHEEL REPORT_DIR [PYTEST_ARGS...]
set -euo pipefail

wheel=$1
report_dir=$2
shift 2

python -m pip install --quiet --no-index --no-deps "$wheel"
# --no-deps keeps the image's torch; pip check still fails on a wrong torch pin.
python -m pip check
python -c 'import moe_kernels; print(moe_kernels.isa())' > "$report_dir/isa.txt"
echo "moe_kernels.isa() = $(cat "$report_dir/isa.txt")"
exec python -m pytest tests/kernels -p no:cacheprovider --junitxml="$report_dir/junit.xml" "$@"
