"""The checkpoint converters on tensors laid out the way AWQ, GPTQ and gpt-oss lay
them out, packed here by each format's own rule (written from the format, not
from the converter), ending in the reference on the converted weights matching a
dense float computation with the dequantized weights, and the op on them matching
the reference."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.checkpoints import int4_from_awq, int4_from_gptq, mxfp4_from_gpt_oss
from moe_xarch.testing import assert_matches_reference, make_moe_problem

INT4, MXFP4 = MoeCompMethod.INT4_W4A8, MoeCompMethod.MXFP4
M, K, N, E, TOPK = 7, 128, 64, 3, 2


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words as the int32 the checkpoints store (two's complement)."""
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)


def _pack_awq(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's pack: int32 column c of a row holds output columns 8c .. 8c+7,
    column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i] in bits 4i..4i+3."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    rows, cols = values.shape[-2:]
    words = torch.zeros(*values.shape[:-1], cols // 8, dtype=torch.long)
    for c in range(cols // 8):
        for i in range(8):
            words[..., c] |= values[..., 8 * c + order[i]].long() << (4 * i)
    return _to_int32(words)


def _pack_sequential(values: torch.Tensor) -> torch.Tensor:
    """GPTQ's pack along the last dimension: value 8c + j in bits 4j..4j+3 of int32 c."""
    words = torch.zeros(*values.shape[:-1], values.shape[-1] // 8, dtype=torch.long)
    for j in range(8):
        words |= values[..., j::8].long() << (4 * j)
    return _to_int32(words)


def _linear_int4(gen: torch.Generator, in_features: int, out_features: int, group: int,
                 zero_range: tuple[int, int] = (0, 16)) -> dict[str, torch.Tensor]:
    """A quantized linear layer in checkpoint orientation ([in, out]) and its dense
    float weight [out, in] = ((q - zero) * scale)^T, per group of ``group`` inputs."""
    q = torch.randint(0, 16, (E, in_features, out_features), generator=gen)
    zeros = torch.randint(*zero_range, (E, in_features // group, out_features), generator=gen)
    scales = ((torch.rand(E, in_features // group, out_features, generator=gen) + 0.5)
              / (8 * math.sqrt(in_features))).half()
    per_row = lambda t: t.repeat_interleave(group, dim=1)  # noqa: E731
    dense = ((q - per_row(zeros)) * per_row(scales.float())).transpose(1, 2)
    return {"q": q, "zeros": zeros, "scales": scales, "dense": dense}


def _moe_problem(method: int, **overrides: Any) -> dict[str, Any]:
    """Routing, activations and biases of a problem; its weights come from overrides."""
    kwargs = make_moe_problem(M, K, N, E, TOPK, torch.float32, method, bias=True, seed=21).kwargs()
    kwargs.update(overrides)
    return kwargs


def _assert_op_and_reference_are_the_dense_math(kwargs: dict[str, Any], w1: torch.Tensor, w2: torch.Tensor) -> None:
    method = kwargs["moe_comp_method"]
    dense = kwargs | {"moe_comp_method": MoeCompMethod.UNQUANT, "w1": w1, "w2": w2, "w1_scale": None,
                      "w2_scale": None, "w1_zero": None, "w2_zero": None}
    expected = reference.fused_experts(**dense)
    oracle = reference.fused_experts(**kwargs)
    assert_matches_reference(oracle, expected, method, torch.float32)
    assert_matches_reference(moe_xarch.fused_experts(**kwargs), oracle, method, torch.float32)


def _w1_of(gate: Any, up: Any) -> torch.Tensor:
    """The op's w1 for SiLU-and-mul: gate rows, then up rows."""
    return torch.cat([gate, up], dim=1)


def _convert_awq(layer: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return int4_from_awq(_pack_awq(layer["q"]), _pack_awq(layer["zeros"]), layer["scales"])


def _gptq_zeros(zeros: torch.Tensor, checkpoint_format: str) -> torch.Tensor:
    """qzeros as each format stores them: AutoGPTQ's ("gptq") zero - 1, "gptq_v2" the zero."""
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    return _pack_sequential(stored & 0xF)


def _convert_gptq(layer: dict[str, torch.Tensor], checkpoint_format: str, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    qweight = _pack_sequential(layer["q"].transpose(1, 2)).transpose(1, 2)  # along the input dimension
    qzeros = _gptq_zeros(layer["zeros"], checkpoint_format)
    return int4_from_gptq(qweight, qzeros, layer["scales"], checkpoint_format=checkpoint_format, **kwargs)


def _check_int4_converter(convert: Any, group: int, zero_range: tuple[int, int] = (0, 16)) -> None:
    gen = torch.Generator().manual_seed(group)
    gate, up = (_linear_int4(gen, K, N, group, zero_range) for _ in range(2))
    down = _linear_int4(gen, N, K, group, zero_range)
    (g, gs, gz), (u, us, uz), (d, ds, dz) = (convert(layer) for layer in (gate, up, down))
    assert g.dtype == torch.uint8 and g.shape == (E, N, K // 2)
    assert gs.dtype == torch.float32 and gs.shape == gz.shape == (E, N, K // group)
    assert gz.dtype == torch.uint8 and d.shape == (E, K, N // 2) and ds.shape == (E, K, N // group)
    # The converted weights are the checkpoint's values exactly: q, zeros, scales in the op's rows.
    assert torch.equal(gz.long(), gate["zeros"].transpose(1, 2))
    assert torch.equal(gs, gate["scales"].transpose(1, 2).float())
    kwargs = _moe_problem(INT4, w1=_w1_of(g, u), w2=d, w1_scale=_w1_of(gs, us), w2_scale=ds,
                          w1_zero=_w1_of(gz, uz), w2_zero=dz)
    _assert_op_and_reference_are_the_dense_math(kwargs, _w1_of(gate["dense"], up["dense"]), down["dense"])


@pytest.mark.parametrize("group", [32, 64])
def test_awq(group: int) -> None:
    _check_int4_converter(_convert_awq, group)


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_gptq(group: int, checkpoint_format: str) -> None:
    # AutoGPTQ's format cannot store a zero point of 0 (it would be -1).
    zero_range = (1, 16) if checkpoint_format == "gptq" else (0, 16)
    _check_int4_converter(lambda layer: _convert_gptq(layer, checkpoint_format), group, zero_range)


@pytest.mark.level_independent  # the converter alone
def test_gptq_sym_and_consecutive_g_idx() -> None:
    """A "sym" checkpoint: zero point 8 everywhere (stored 7), g_idx = i // G."""
    gen = torch.Generator().manual_seed(3)
    layer = _linear_int4(gen, K, N, 32, zero_range=(8, 9))
    _, _, zero = _convert_gptq(layer, "gptq", g_idx=torch.arange(K, dtype=torch.int32) // 32)
    assert torch.equal(zero, torch.full((E, N, K // 32), 8, dtype=torch.uint8))


@pytest.mark.level_independent  # the converter alone
def test_awq_nibble_order_is_the_interleaved_one() -> None:
    """One int32 of AWQ: nibble i holds output column [0, 2, 4, 6, 1, 3, 5, 7][i]."""
    word = sum(v << (4 * i) for i, v in enumerate([1, 2, 3, 4, 5, 6, 7, 8]))  # nibble i holds i + 1
    qweight = _to_int32(torch.full((32, 1), word))
    w, _, _ = int4_from_awq(qweight, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 8))
    columns = [1, 5, 2, 6, 3, 7, 4, 8]  # column j holds nibble [0, 4, 1, 5, 2, 6, 3, 7][j]
    assert [(int(w[j, 0]) & 0xF) for j in range(8)] == columns


def _gpt_oss_dense(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """openai/gpt-oss's dequantization: a 16-entry table by nibble, the low nibble
    of a byte first, times 2^(scale - 127)."""
    table = torch.tensor([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    values = torch.stack([table[(blocks & 0x0F).long()], table[(blocks >> 4).long()]], dim=-1).flatten(-2)
    values = torch.ldexp(values, (scales.int() - 127).unsqueeze(-1).float())
    return values.flatten(-2)


def _gpt_oss_weight(gen: torch.Generator, rows: int, cols: int, fan_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=gen, dtype=torch.uint8)
    centre = 127 - 2 - round(math.log2(math.sqrt(fan_in)))  # O(1 / sqrt(fan_in)) weights
    scales = torch.randint(centre - 2, centre + 1, (E, rows, cols // 32), generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_gpt_oss() -> None:
    """mlp1 (gate and up interleaved: the op's swiglu form) and mlp2, with gpt-oss's
    alpha, limit and biases."""
    gen = torch.Generator().manual_seed(4)
    mlp1, mlp2 = _gpt_oss_weight(gen, 2 * N, K, K), _gpt_oss_weight(gen, K, N, N)
    (w1, s1), (w2, s2) = mxfp4_from_gpt_oss(*mlp1), mxfp4_from_gpt_oss(*mlp2)
    assert w1.shape == (E, 2 * N, K // 2) and s1.shape == (E, 2 * N, K // 32) and w2.shape == (E, K, N // 2)
    assert w1.dtype == s1.dtype == torch.uint8
    kwargs = _moe_problem(MXFP4, w1=w1, w2=w2, w1_scale=s1, w2_scale=s2, alpha=1.702, limit=7.0)
    _assert_op_and_reference_are_the_dense_math(kwargs, _gpt_oss_dense(*mlp1), _gpt_oss_dense(*mlp2))


def _awq_layer(**overrides: torch.Tensor) -> dict[str, torch.Tensor]:
    layer = {"qweight": torch.zeros(64, 4, dtype=torch.int32), "qzeros": torch.zeros(2, 4, dtype=torch.int32),
             "scales": torch.ones(2, 32, dtype=torch.float16)}
    return layer | overrides


def _gptq_layer(**overrides: Any) -> dict[str, Any]:
    layer = {"qweight": torch.zeros(8, 32, dtype=torch.int32), "qzeros": torch.zeros(2, 4, dtype=torch.int32),
             "scales": torch.ones(2, 32, dtype=torch.float16)}
    return layer | overrides


@pytest.mark.level_independent  # the converters' own checks
@pytest.mark.parametrize(
    "convert, arguments, names",
    [
        (int4_from_awq, _awq_layer(qweight=torch.zeros(64, 4, dtype=torch.int64)), "qweight"),
        (int4_from_awq, _awq_layer(qzeros=torch.zeros(2, 3, dtype=torch.int32)), "qzeros"),
        (int4_from_awq, _awq_layer(scales=torch.ones(2, 31)), "scales"),
        (int4_from_awq, _awq_layer(scales=torch.ones(4, 32)), "scales"),  # G = 16
        (int4_from_awq, _awq_layer(scales=torch.ones(3, 32)), "scales"),  # 3 groups of 64 inputs
        (int4_from_awq, _awq_layer(scales=torch.ones(2, 32, dtype=torch.int32)), "scales"),
        (int4_from_gptq, _gptq_layer(qzeros=torch.full((2, 4), -1, dtype=torch.int32)), "qzeros"),  # zero 16
        (int4_from_gptq, _gptq_layer(g_idx=torch.arange(64).flip(0) // 32), "g_idx"),
        (int4_from_gptq, _gptq_layer(checkpoint_format="gptq_v3"), "checkpoint_format"),
        (int4_from_gptq, _gptq_layer(qweight=torch.zeros(8, 30, dtype=torch.int32)), "qweight"),
        (mxfp4_from_gpt_oss, {"blocks": torch.zeros(4, 2, 16, dtype=torch.int8), "scales": torch.zeros(4, 2)}, "blocks"),
        (mxfp4_from_gpt_oss, {"blocks": torch.zeros(4, 2, 8, dtype=torch.uint8),
                              "scales": torch.zeros(4, 2, dtype=torch.uint8)}, "blocks"),
        (mxfp4_from_gpt_oss, {"blocks": torch.zeros(4, 2, 16, dtype=torch.uint8),
                              "scales": torch.zeros(4, 3, dtype=torch.uint8)}, "scales"),
        (mxfp4_from_gpt_oss, {"blocks": torch.zeros(4, 2, 16, dtype=torch.uint8),
                              "scales": torch.full((4, 2), 255, dtype=torch.uint8)}, "scales"),
    ],
    ids=["awq-qweight-int64", "awq-qzeros-shape", "awq-scales-out", "awq-group-16", "awq-groups-not-dividing",
         "awq-scales-int", "gptq-zero-16", "gptq-act-order", "gptq-format", "gptq-out-not-8s",
         "gpt_oss-blocks-int8", "gpt_oss-blocks-8-bytes", "gpt_oss-scales-shape", "gpt_oss-scale-nan"],
)
def test_converters_reject(convert: Any, arguments: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match=rf"^{names}:"):
        convert(**arguments)
