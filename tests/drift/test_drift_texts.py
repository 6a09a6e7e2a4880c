"""Every drift proof still finds the text it edits, on every host and in the quick
session: the proofs themselves run only in their own sessions (drift-native,
drift-emulated) or on another architecture's host (the aarch64 native drift), where
a source edit that moved their text would otherwise first show."""

from __future__ import annotations

import pytest

from tests.drift import test_emulated_drift, test_gha_matrix_drift, test_kernel_use_drift, test_worst_case_drift
from tests.drift.conftest import REPO
from tests.drift.support import source_to_drift

EDITS = {
    **{f"native-{arch}": (drift.source, drift.pristine) for arch, drift in test_kernel_use_drift.DRIFTS.items()},
    **{f"emulated-{drift.name}": (drift.source, drift.pristine)
       for drift in (test_emulated_drift.RUNS_DOTPRODS_INT8_GEMM, test_emulated_drift.DROPS_BF16_K_TAIL,
                     test_emulated_drift.LOOSENED_ON_AARCH64)},
    "gha-matrix": (test_gha_matrix_drift.SOURCE, test_gha_matrix_drift.PRISTINE),
    **{f"overflow-{arch}-{i}": (drift.source, drift.pristine)
       for arch, drifts in test_worst_case_drift.OVERFLOWS.items() for i, drift in enumerate(drifts)},
    "tolerance-call": (test_worst_case_drift.TESTING, test_worst_case_drift.COMPARISON),
    "tolerance-recorded": (test_worst_case_drift.TESTING, test_worst_case_drift.RECORDED),
}


@pytest.mark.parametrize("source, pristine", EDITS.values(), ids=EDITS.keys())
def test_the_drift_finds_its_text(source: str, pristine: str) -> None:
    source_to_drift(REPO, source, pristine)
