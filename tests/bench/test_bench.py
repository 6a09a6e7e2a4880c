"""The benchmark's plumbing on tiny shapes: table, JSON, plot, and SGLang's skip and check.

No timing is asserted anywhere: these shapes take microseconds and the machine is shared.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
moe_xarch = pytest.importorskip("moe_xarch")

from benchmarks import moe_bench, rooflines, sglang, workload  # noqa: E402

# K and N hold whole INT4_W4A8 groups.
TINY = {
    "tiny": workload.MoeShape("tiny", experts=4, topk=2, hidden=256, inter=128),
    "tiny-swiglu": workload.MoeShape("tiny-swiglu", experts=4, topk=2, hidden=256, inter=128, swiglu=True),
}
QUICK = ["--tokens", "1", "3", "--threads", "1", "2", "--budget", "0", "--min-iterations", "2",
         "--max-iterations", "2"]


@pytest.fixture(autouse=True)
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "SHAPES", TINY)
    monkeypatch.setattr(rooflines, "ROOFLINE_GEMM", 64)
    yield
    torch.set_num_threads(1)


def run(tmp_path: Path, *args: str) -> dict:
    assert moe_bench.main(["--shapes", *TINY, *QUICK, "--out", str(tmp_path), *args]) == 0
    return json.loads((tmp_path / "moe_bench.json").read_text())


def test_int4_groups_divide_every_shapes_k_and_n() -> None:
    """AWQ's usual 128 where it divides K and N; gpt-oss-20b's 2880 takes 64, a power of two as AWQ's and
    GPTQ's groups are. The bytes count a float32 scale and a uint8 zero point per group."""
    assert workload.int4_group(2048, 768) == 128
    assert workload.int4_group(2880, 2880) == 64
    assert workload.int4_group(2880, 2880 + 32) == 32
    gpt_oss = workload.MoeShape("gpt-oss-like", experts=2, topk=1, hidden=2880, inter=2880)
    assert workload.weight_bytes(gpt_oss, "int4") == 0.5 + 5 / 64
    assert workload.weight_bytes(gpt_oss, "int8") == 1
    with pytest.raises(ValueError, match="K=2880, N=100"):
        workload.int4_group(2880, 100)


def test_pure_torch_computes_in_the_dtype_this_machines_matmul_runs_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without bf16 instructions multiplies bf16 on a slow path: pure torch then computes in fp32."""
    rates = {torch.bfloat16: 0.6, torch.float32: 35.0}
    monkeypatch.setattr(rooflines, "matmul_gflops", lambda dtype, threads: rates[dtype] * threads)
    assert rooflines.compute_rooflines([1, 2]) == ({1: {"bf16": 0.6, "fp32": 35.0}, 2: {"bf16": 1.2, "fp32": 70.0}},
                                                   "fp32")
    rates[torch.bfloat16] = 90.0
    assert rooflines.compute_rooflines([2])[1] == "bf16"


def test_memory_roofline_reads_follow_on_through_the_pool() -> None:
    """Each read starts where the last ended, from the start again where the rest is too short, never past the
    pool: a read of the same bytes every call would find them in cache where the experts' weights are not."""
    pool = rooflines.StreamPool(4096 * 4)
    assert pool.window(1000 * 4) == slice(0, 1000)
    assert pool.window(1000 * 4) == slice(1000, 2000)
    assert pool.window(3000 * 4) == slice(0, 3000)
    assert pool.window(10**9) == slice(0, 4096)
    assert pool.window(1) == slice(0, 1)


def test_memory_roofline_reads_pages_of_the_kind_packed_weights_lie_on() -> None:
    """Both advised onto transparent huge pages, or neither: a read on 4 KiB pages would miss the TLB where
    the weights do not."""
    from moe_xarch.testing import HUGE_PAGE, vm_flags, whole_huge_page

    pool = rooflines.StreamPool(8 * HUGE_PAGE)
    weight = torch.randn(2, 1024, 2048).to(torch.bfloat16)  # 8 MiB packed
    packed = moe_xarch.convert_weight_packed(weight, moe_xarch.MoeCompMethod.UNQUANT)
    pool_flags, packed_flags = (vm_flags(whole_huge_page(tensor)) for tensor in (pool.buffer, packed))
    assert ("hg" in pool_flags) == ("hg" in packed_flags)


def test_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = run(tmp_path, "--no-sglang")
    out = capsys.readouterr().out

    results = document["results"]
    assert len(results) == 2 * 5 * 2 * 2  # shapes x methods x M x threads
    for r in results:
        assert set(r["median_ms"]) == {"moe_xarch", "torch", "memory_roofline"}
        assert all(v > 0 for v in r["median_ms"].values())
        assert r["speedup_vs_sglang"] is None
        assert r["iterations"] == 2
        assert r["active_bytes"] > 0 and r["achieved_gbs"] > 0 and r["roofline_gbs"] > 0
    assert {(r["shape"], r["method"], r["tokens"], r["threads"]) for r in results} == {
        (s, m, t, n) for s in TINY for m in ("bf16", "int8", "fp8", "int4", "mxfp4") for t in (1, 3) for n in (1, 2)}
    meta = document["meta"]
    assert len(meta["loadavg_start"]) == 3 and len(meta["loadavg_end"]) == 3
    assert meta["sglang"] == {"available": False, "message": "left out (--no-sglang)"}
    assert set(document["compute_roofline_gflops"]) == {"1", "2"}
    assert {threads: set(rates) for threads, rates in document["matmul_gflops"].items()} == {
        "1": {"bf16", "fp32"}, "2": {"bf16", "fp32"}}
    assert meta["torch_dtype"] in ("bf16", "fp32")
    assert all(c["moe_xarch"]["ok"] for c in document["verification"].values())
    assert {t["target"] for t in document["targets"]} >= {"int8 decode vs bf16 decode (M=1)",
                                                            "4-bit decode vs int8 decode (M <= 4)",
                                                            "4-bit decode of the streaming roofline (M <= 4)",
                                                            "2 threads vs 1 thread at M >= 16"}
    assert {(d["shape"], d["threads"]) for d in document["derived"]["int8_vs_bf16_decode"]} == {
        (s, n) for s in TINY for n in (1, 2)}
    assert {(d["shape"], d["method"], d["tokens"], d["threads"]) for d in document["derived"]["four_bit_vs_int8_decode"]} == {
        (s, m, t, n) for s in TINY for m in ("int4", "mxfp4") for t in (1, 3) for n in (1, 2)}
    # The 4-bit methods' bytes count their scales (and zeros): a little more than half of int8's.
    active = {(r["shape"], r["method"], r["tokens"]): r["active_bytes"] for r in results}
    for s, _, t in active:
        assert 0.5 < active[(s, "int4", t)] / active[(s, "int8", t)] < 0.6
        assert 0.5 < active[(s, "mxfp4", t)] / active[(s, "int8", t)] < 0.6

    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| shape | method | M | thr | moe_xarch ms | sglang ms | torch ms")
    assert len(table) == 1 + len(results)
    assert all(line.count("|") == 13 for line in table)
    assert "goals (worst case, at 2 threads):" in out
    for name in TINY:
        assert f"[{name}] M=3:" in out  # a progress line per shape and M
    assert (tmp_path / "moe_bench.md").read_text().startswith("| shape |")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in out
    else:
        assert (tmp_path / "moe_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sglang_skipped_with_a_message_when_torch_does_not_match(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang, "TORCH_PIN", "0.0.0+elsewhere")
    monkeypatch.setattr(sglang, "_fetch", lambda cache: pytest.fail("must not download"))
    document = run(tmp_path, "--methods", "bf16", "--sglang-cache", str(tmp_path / "cache"))
    out = capsys.readouterr().out
    assert f"torch {torch.__version__} is installed" in out
    assert "skipping the SGLang contender" in out
    assert document["meta"]["sglang"]["available"] is False
    assert "0.0.0+elsewhere" in document["meta"]["sglang"]["message"]
    assert all("sglang" not in r["median_ms"] for r in document["results"])


def test_sglang_skipped_on_another_architecture() -> None:
    reason = sglang.unavailable_reason("aarch64", sglang.TORCH_PIN)
    assert reason and "x86_64 only" in reason and "int8 only" in reason
    loaded = sglang.load(Path("/nonexistent"), machine="aarch64")
    assert loaded.ops is None and "skipping the SGLang contender" in loaded.message
    assert sglang.unavailable_reason("x86_64", sglang.TORCH_PIN) is None


def test_sglang_library_that_kills_its_loader_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without the instructions it was built for, the library dies with SIGILL as it loads: a child
    process takes that, and the benchmark goes on without SGLang."""
    cache = tmp_path / "cache"
    library = cache / sglang.WHEEL_MEMBER
    library.parent.mkdir(parents=True)
    source = tmp_path / "dies.c"
    source.write_text("#include <signal.h>\n__attribute__((constructor)) static void die(void) { raise(SIGILL); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setattr(sglang, "TORCH_PIN", torch.__version__)
    monkeypatch.setattr(sglang, "MACHINE", platform.machine())

    document = run(tmp_path, "--methods", "bf16", "--sglang-cache", str(cache))
    out = capsys.readouterr().out
    assert "_C.abi3.so dies with SIGILL" in out and "skipping the SGLang contender" in out
    assert document["meta"]["sglang"]["available"] is False
    assert all("sglang" not in r["median_ms"] for r in document["results"])


def sglang_runs_here() -> bool:
    library = sglang.DEFAULT_CACHE / sglang.WHEEL_MEMBER
    return (library.is_file() and sglang.unavailable_reason(platform.machine(), torch.__version__) is None
            and sglang.crash_reason(library) is None)


@pytest.mark.skipif(not sglang_runs_here(), reason="SGLang's kernel is not cached here, or cannot run here")
def test_sglang_checked_against_the_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where the kernel is at hand: it is timed where it matches, and reported, untimed, where it does not."""
    document = run(tmp_path)
    out = capsys.readouterr().out
    verification = document["verification"]
    assert verification["tiny/bf16"]["sglang"]["ok"]
    # SGLang's int8 and int4 paths ignore biases, alpha and limit: they compute something else for gpt-oss.
    assert not verification["tiny-swiglu/int8"]["sglang"]["ok"]
    assert "[tiny-swiglu] int8: sglang computes something else" in out
    assert verification["tiny/int4"]["sglang"]["ok"] and verification["tiny/mxfp4"]["sglang"]["ok"]
    assert not verification["tiny-swiglu/int4"]["sglang"]["ok"]
    for r in document["results"]:
        timed = verification[f"{r['shape']}/{r['method']}"]["sglang"]["ok"]
        assert ("sglang" in r["median_ms"]) == timed
        assert (r["speedup_vs_sglang"] is not None) == timed
