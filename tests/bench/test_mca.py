"""The llvm-mca figure's host side: the assembly's functions and loops, what an iteration does, the repeats' check.

The assembly is written here in the compilers' own layout; one test runs llvm-mca
itself on a loop whose answer is known (independent sdot: the core's peak).
"""

from __future__ import annotations

import pytest

from benchmarks import mca

AARCH64 = """\
	.text
	.align	2
	.type	_Z4tilePKaS0_Pii, %function
_Z4tilePKaS0_Pii:
.LFB0:
	movi	v0.4s, 0  // clear the accumulator
.L2:
	mov	x5, 0
.L3:
	ldr	q1, [x0], 16
	ld1	{v2.16b - v3.16b}, [x1], 32
	sdot	v0.4s, v1.16b, v2.16b
	sdot	v0.4s, v1.16b, v3.16b
	subs	x2, x2, #1
	bne	.L3
	add	x4, x4, 1
	cmp	x4, x6
	bne	.L2
	str	q0, [x3]
	ret
.L7:
	add	x7, x7, 1
	b	.L7
	.size	_Z4tilePKaS0_Pii, .-_Z4tilePKaS0_Pii
	.type	_Z5widenPKhPf, %function
_Z5widenPKhPf:
.L9:
	ldr	d1, [x0], 8
	ushll	v2.8h, v1.8b, #0
	str	q2, [x1], 16
	cbnz	x2, .L9
.L10:
	ldrb	w3, [x0], 1
	strb	w3, [x1], 1
	tbnz	x2, #3, .L10
	ret
	.size	_Z5widenPKhPf, .-_Z5widenPKhPf
"""

X86 = """\
	.type	_Z4tilev, @function
_Z4tilev:
.L4:
	vmovdqu8	(%rsi,%rax), %zmm1
	vpbroadcastd	4(%rdi), %zmm2
	vpdpbusd	%zmm1, %zmm2, %zmm0
	vpdpbusd	64(%rsi,%rax), %zmm2, %zmm3
	addq	$128, %rax
	cmpq	%rdx, %rax
	jne	.L4
	vmovdqu64	%zmm0, (%rcx)
	ret
.L6:
	jmp	.L6
	.size	_Z4tilev, .-_Z4tilev
"""


def test_functions_keep_instructions_and_labels_without_directives_or_comments() -> None:
    found = mca.functions(AARCH64)
    assert list(found) == ["_Z4tilePKaS0_Pii", "_Z5widenPKhPf"]
    tile = found["_Z4tilePKaS0_Pii"]
    assert tile[:3] == [".LFB0:", "movi\tv0.4s, 0", ".L2:"]
    assert not any(line.startswith(".size") or "//" in line for line in tile)


def test_the_innermost_loop_is_found_and_an_unconditional_back_edge_is_no_loop() -> None:
    tile = mca.functions(AARCH64)["_Z4tilePKaS0_Pii"]
    loops = mca.innermost_loops("tile", tile, "aarch64")
    assert [(loop.label, len(loop.instructions)) for loop in loops] == [(".L3", 6)]
    assert loops[0].instructions[-1] == "bne\t.L3"
    x86 = mca.innermost_loops("tile", mca.functions(X86)["_Z4tilev"], "x86_64")
    assert [loop.label for loop in x86] == [".L4"]


def test_cbnz_and_tbnz_close_loops() -> None:
    widen = mca.functions(AARCH64)["_Z5widenPKhPf"]
    assert [loop.label for loop in mca.innermost_loops("widen", widen, "aarch64")] == [".L9", ".L10"]


def test_hot_loops_are_the_multiplying_ones_or_else_the_vector_stores() -> None:
    hot = mca.hot_loops(AARCH64, "aarch64")
    # The scalar byte copy (.L10) stores no vector: not hot.
    assert [(loop.function, loop.label) for loop in hot] == [("_Z4tilePKaS0_Pii", ".L3"), ("_Z5widenPKhPf", ".L9")]


def test_macs_per_iteration_by_instruction() -> None:
    loop = mca.innermost_loops("tile", mca.functions(AARCH64)["_Z4tilePKaS0_Pii"], "aarch64")[0]
    assert mca.loop_macs(loop.instructions, "aarch64") == {"sdot\tv0.4s, v1.16b, v2.16b": 32}
    assert mca.instruction_macs("smmla\tv0.4s, v1.16b, v2.16b", "aarch64") == 32
    assert mca.instruction_macs("fmla\tv0.4s, v1.4s, v2.s[1]", "aarch64") == 4
    assert mca.instruction_macs("add\tv0.4s, v1.4s, v2.4s", "aarch64") == 0
    x86 = mca.innermost_loops("tile", mca.functions(X86)["_Z4tilev"], "x86_64")[0]
    assert sum(mca.loop_macs(x86.instructions, "x86_64").values()) == 2 * 64
    assert mca.instruction_macs("vdpbf16ps\t%ymm1, %ymm2, %ymm0", "x86_64") == 16


def test_vpmaddwd_multiplies_unless_vpmaddubsw_made_the_pairs() -> None:
    alone = ["vpmaddwd\t%ymm1, %ymm2, %ymm0"]
    assert mca.loop_macs(alone, "x86_64") == {alone[0]: 16}
    summed = ["vpmaddubsw\t%ymm1, %ymm2, %ymm3", "vpmaddwd\t%ymm4, %ymm3, %ymm3"]
    assert mca.loop_macs(summed, "x86_64") == {summed[0]: 32}


@pytest.mark.parametrize(("instruction", "expected"), [
    ("ldr\tq1, [x0], 16", ("load", 16)),
    ("ldp\tq1, q2, [x0, 32]", ("load", 32)),
    ("ld1\t{v2.16b - v3.16b}, [x1], 32", ("load", 32)),
    ("ld2\t{v2.16b, v3.16b}, [x1]", ("load", 32)),
    ("ld1r\t{v4.4s}, [x2]", ("load", 4)),
    ("ld1\t{v4.s}[1], [x2]", ("load", 4)),
    ("ldrb\tw3, [x0], 1", ("load", 1)),
    ("ldrsh\tw3, [x0]", ("load", 2)),
    ("ldr\td1, [x0], 8", ("load", 8)),
    ("str\tq0, [x3]", ("store", 16)),
    ("stp\td0, d1, [x3]", ("store", 16)),
    ("add\tx0, x0, 16", ("", 0)),
])
def test_aarch64_bytes_loaded_and_stored(instruction: str, expected: tuple[str, int]) -> None:
    assert mca.aarch64_access(instruction) == expected


@pytest.mark.parametrize(("instruction", "expected"), [
    ("vmovdqu8\t(%rsi,%rax), %zmm1", ("load", 64)),
    ("vpbroadcastd\t4(%rdi), %zmm2", ("load", 4)),
    ("vpdpbusd\t64(%rsi,%rax), %zmm2, %zmm3", ("load", 64)),
    ("vfmadd231ps\t(%rdi){1to16}, %zmm1, %zmm0", ("load", 4)),
    ("vpmovzxbw\t(%rsi), %ymm1", ("load", 16)),
    ("vmovdqu64\t%zmm0, (%rcx)", ("store", 64)),
    ("movq\t8(%rsp), %rax", ("load", 8)),
    ("leaq\t8(%rsp), %rax", ("", 0)),
    ("prefetcht0\t256(%rsi)", ("", 0)),
])
def test_x86_bytes_loaded_and_stored(instruction: str, expected: tuple[str, int]) -> None:
    assert mca.x86_access(instruction) == expected


def test_kernel_sources_keep_the_level_flags_and_drop_the_output() -> None:
    database = [
        {"directory": "/b", "file": "/t/src/arm/neon/gemm.cpp",
         "command": "/usr/bin/g++ -DMOE_XARCH_LEVEL=neon -I/t/src -O3 -march=armv8-a -MD -MT x.o -MF x.o.d "
                    "--coverage -o x.o -c /t/src/arm/neon/gemm.cpp"},
        {"directory": "/b", "file": "/t/src/common/op.cpp", "command": "/usr/bin/g++ -O3 -o y.o -c /t/src/common/op.cpp"},
    ]
    [source] = mca.kernel_sources(database, mca.Path("/t"))
    assert (source.level, source.file, source.directory) == ("neon", "src/arm/neon/gemm.cpp", "/b")
    assert source.arguments == ("/usr/bin/g++", "-DMOE_XARCH_LEVEL=neon", "-I/t/src", "-O3", "-march=armv8-a")


@pytest.mark.parametrize(("demangled", "expected"), [
    ("void moe_xarch::(anonymous namespace)::dot_tile<moe_xarch::S8DotOps, 4, 4>(signed char const*, int)",
     "dot_tile<S8DotOps, 4, 4>"),
    ("moe_xarch::neon::silu_mul(float*, long) [clone .constprop.0]", "neon::silu_mul [clone .constprop.0]"),
    ("unsigned char const* moe_xarch::(anonymous namespace)::mmla_pairs<moe_xarch::(anonymous namespace)::MmlaS8>"
     "(long, long, signed char const*, long)", "mmla_pairs<MmlaS8>"),
])
def test_short_names(demangled: str, expected: str) -> None:
    assert mca.short_name(demangled) == expected


def test_methods_from_kernel_names() -> None:
    assert mca.method_of("dot_tile<S8DotOps, 4, 4>") == "int8"
    assert mca.method_of("w4a8_tile<4, 4>") == "int4"
    assert mca.method_of("quantize_row_s8") == "rows"
    assert mca.method_of("mmla_pairs<MmlaS8>") == mca.method_of("w4a8_split") == "rows"
    assert mca.method_of("mxfp4_to_bf16") == "mxfp4"
    assert mca.method_of("pack") == "?"


def test_repeats_that_differ_are_named() -> None:
    row = {"core": "neoverse-n1", "level": "dotprod", "file": "f.cpp", "kernel": "k", "label": ".L3", "cycles": 2.0}
    assert mca.compare_repeats([[row], [dict(row)]]) == []
    assert mca.compare_repeats([[row], [{**row, "cycles": 2.5}]]) == [
        "run 2, neoverse-n1 dotprod f.cpp k .L3: 2.5 cycles/iteration, first run 2.0"]
    assert mca.compare_repeats([[row], []]) == ["run 2 measured other configurations"]


def test_the_summary_gives_each_level_and_methods_best_rate_and_its_range() -> None:
    rows = [{"core": "n1", "level": "dotprod", "method": "int8", "kernel": "tile 4x4", "fraction": 0.99,
             "macs_per_cycle": 31.8},
            {"core": "n1", "level": "dotprod", "method": "int8", "kernel": "tile 1x8", "fraction": 0.88,
             "macs_per_cycle": 28.1},
            {"core": "n1", "level": "neon", "method": "mxfp4", "kernel": "widen", "fraction": 0.05}]
    assert mca.summarize(rows) == [
        {"core": "n1", "level": "dotprod", "method": "int8", "loops": 2, "best_macs_per_cycle": 31.8,
         "lowest_fraction": 0.88, "highest_fraction": 0.99, "lowest": "tile 1x8"},
        {"core": "n1", "level": "neon", "method": "mxfp4", "loops": 1, "best_macs_per_cycle": None,
         "lowest_fraction": 0.05, "highest_fraction": 0.05, "lowest": "widen"}]
    assert "| n1 | dotprod | int8 | 2 | 31.8 | 88% - 99% | tile 1x8 |" in mca.format_summary(mca.summarize(rows))


@pytest.fixture(scope="module")
def llvm_mca() -> str:
    return mca.ensure_llvm_mca()


def test_independent_sdot_is_the_cores_peak_and_a_chain_is_latency_bound(llvm_mca: str) -> None:
    sdot = "sdot\tv0.4s, v1.16b, v2.16b"
    # Neoverse N1 issues sdot on its two vector pipes: 2 x 16 MACs a cycle.
    assert mca.peak_macs(sdot, "aarch64", "neoverse-n1") == pytest.approx(32, rel=0.05)
    chained = mca.run_mca([sdot] * 4, "aarch64", "neoverse-n1", llvm_mca)
    assert chained.cycles > 1.15 * chained.block_rthroughput  # one accumulator: each waits for the last
