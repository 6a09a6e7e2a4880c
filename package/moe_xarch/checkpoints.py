"""Converters from what 4-bit checkpoints hold to the op's argument layout.

Each converter takes one weight's tensors as the checkpoint stores them (any
leading dimensions, e.g. experts stacked, are kept) and returns the op's
``(w, w_scale[, w_zero])`` for that weight, row = output channel:

- INT4_W4A8: uint8 ``[..., out, in / 2]`` (column 2j in the low nibble of byte j),
  float32 scales and uint8 zeros ``[..., out, in / G]``.
- MXFP4: uint8 ``[..., rows, cols / 2]`` and uint8 E8M0 scales ``[..., rows, cols / 32]``.

A layer's w1 is its gate and up projections' rows: concatenated (gate first) for
the default SiLU-and-mul, interleaved for swiglu, which is how gpt-oss stores it.
"""

from __future__ import annotations

import torch

from moe_xarch.quant import E8M0_NAN, INT4_MAX, MXFP4_BLOCK, pack_nibbles

__all__ = ["AWQ_ORDER", "int4_from_awq", "int4_from_gptq", "mxfp4_from_gpt_oss"]

# AWQ's (AutoAWQ's GEMM format) order of output columns in an int32: nibble i
# (bits 4i..4i+3) of packed column c holds output column 8c + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_PER_INT32 = 8
_GPTQ_FORMATS = ("gptq", "gptq_v2")


def _check_int32(name: str, t: torch.Tensor, rank: int) -> None:
    if t.dtype != torch.int32 or t.dim() < rank:
        raise ValueError(f"{name}: expected int32 with eight 4-bit values each, [..., rows, cols], got {t.dtype} "
                         f"{list(t.shape)}")


def _int32_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` int32 to ``[..., n, 8]``: nibble i is bits 4i..4i+3."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return (packed.unsqueeze(-1) >> shifts) & INT4_MAX


def _check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name}: expected shape {list(expected)} ({what}), got {list(t.shape)}")


def _group_count(scales: torch.Tensor, lead: list[int], in_features: int, out_features: int) -> int:
    """The groups along the input dimension that ``scales`` [..., groups, out] gives."""
    if scales.dim() != len(lead) + 2 or tuple(scales.shape[:-2]) != tuple(lead) or scales.shape[-1] != out_features:
        raise ValueError(f"scales: expected shape [{', '.join(map(str, [*lead, 'in / G', out_features]))}] "
                         f"([..., in / G, out]), got {list(scales.shape)}")
    if not scales.is_floating_point():
        raise ValueError(f"scales: expected a float tensor, got {scales.dtype}")
    groups = scales.shape[-2]
    if groups <= 0 or in_features % groups or (in_features // groups) % MXFP4_BLOCK:
        raise ValueError(
            f"scales: {groups} groups along {in_features} input features; INT4_W4A8 needs a group size "
            f"that divides them and is a multiple of {MXFP4_BLOCK}"
        )
    return groups


def _op_layout(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checkpoint orientation ([..., in, out] values, [..., groups, out] scales and
    zeros) to the op's rows of output channels."""
    if bool((zeros < 0).any()) or bool((zeros > INT4_MAX).any()):
        raise ValueError(f"qzeros: zero points must be in [0, {INT4_MAX}] for INT4_W4A8, got "
                         f"[{int(zeros.min())}, {int(zeros.max())}]")
    return (
        pack_nibbles(q.transpose(-1, -2).to(torch.uint8)).contiguous(),
        scales.transpose(-1, -2).float().contiguous(),
        zeros.transpose(-1, -2).to(torch.uint8).contiguous(),
    )


def int4_from_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One linear layer of an AWQ checkpoint (AutoAWQ's GEMM format, also what
    llm-awq exports) as INT4_W4A8 weights.

    The format, for ``in`` input and ``out`` output features and group size G:
    ``qweight`` int32 ``[in, out / 8]`` and ``qzeros`` int32 ``[in / G, out / 8]``,
    each int32 holding 8 consecutive output columns in the interleaved order
    ``AWQ_ORDER`` = [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column 8c + order[i]);
    ``scales`` float16 ``[in / G, out]``. Zero points are stored as they are:
    weight = (q - zero) * scale.

    Returns:
        ``(w, w_scale, w_zero)``: uint8 ``[..., out, in / 2]``, float32 and uint8
        ``[..., out, in / G]``.

    Raises:
        ValueError: a tensor of another dtype or shape, naming it, or a group
            size that INT4_W4A8 cannot take.
    """
    _check_int32("qweight", qweight, 2)
    _check_int32("qzeros", qzeros, 2)
    *lead, in_features, packed_out = qweight.shape
    out_features = packed_out * _PER_INT32
    groups = _group_count(scales, lead, in_features, out_features)
    _check_shape("qzeros", qzeros, (*lead, groups, packed_out), "[..., in / G, out / 8], like scales")
    reverse = torch.tensor(AWQ_ORDER).argsort()  # position j <- the nibble holding column j

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        return _int32_nibbles(packed)[..., reverse].flatten(-2)

    return _op_layout(unpack(qweight), scales, unpack(qzeros))


def int4_from_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None = None,
    *,
    checkpoint_format: str = "gptq",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One linear layer of a GPTQ checkpoint (AutoGPTQ / GPTQModel, 4 bits) as
    INT4_W4A8 weights.

    The format, for ``in`` input and ``out`` output features and group size G:
    ``qweight`` int32 ``[in / 8, out]``, packed along the INPUT dimension in order
    (nibble j of row r holds input row 8r + j); ``qzeros`` int32 ``[in / G, out / 8]``,
    packed along the output dimension in order; ``scales`` float16 ``[in / G, out]``;
    optional ``g_idx`` int32 ``[in]``, the group of each input row.
    ``checkpoint_format`` is GPTQModel's name for the zero-point convention:
    "gptq" (AutoGPTQ's, also what "sym" checkpoints use: zero point 8 stored as 7)
    stores zero - 1, "gptq_v2" stores the zero point itself.

    Returns:
        ``(w, w_scale, w_zero)``: uint8 ``[..., out, in / 2]``, float32 and uint8
        ``[..., out, in / G]``.

    Raises:
        ValueError: a tensor of another dtype or shape, naming it; a group size
            that INT4_W4A8 cannot take; a ``g_idx`` other than consecutive groups
            (act-order, desc_act, permutes rows: not the op's layout); a "gptq"
            zero point of 16 (stored 15), outside [0, 15].
    """
    if checkpoint_format not in _GPTQ_FORMATS:
        raise ValueError(f"checkpoint_format: expected one of {list(_GPTQ_FORMATS)}, got {checkpoint_format!r}")
    _check_int32("qweight", qweight, 2)
    _check_int32("qzeros", qzeros, 2)
    *lead, packed_in, out_features = qweight.shape
    in_features = packed_in * _PER_INT32
    if out_features % _PER_INT32:
        raise ValueError(f"qweight: {out_features} output features do not fill qzeros' int32s of 8")
    groups = _group_count(scales, lead, in_features, out_features)
    _check_shape("qzeros", qzeros, (*lead, groups, out_features // _PER_INT32), "[..., in / G, out / 8], like scales")
    if g_idx is not None:
        consecutive = torch.arange(in_features) // (in_features // groups)
        if g_idx.shape != consecutive.shape or not torch.equal(g_idx.long(), consecutive):
            raise ValueError(
                "g_idx: INT4_W4A8 takes consecutive groups (g_idx[i] = i // G); this checkpoint orders its "
                "input rows otherwise (act-order / desc_act)"
            )
    q = _int32_nibbles(qweight).transpose(-1, -2).flatten(-3, -2)
    zeros = _int32_nibbles(qzeros).flatten(-2)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    return _op_layout(q, scales, zeros)


def mxfp4_from_gpt_oss(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert weight of a gpt-oss checkpoint (``*_blocks`` / ``*_scales``, as
    openai/gpt-oss and transformers' gpt-oss load them) as MXFP4 weights.

    The format: ``blocks`` uint8 ``[..., rows, cols / 32, 16]``, 32 E2M1 values per
    block, two per byte, the even column in the low nibble; ``scales`` uint8
    ``[..., rows, cols / 32]``, E8M0 with bias 127. These are the op's bytes
    reshaped. gpt-oss's mlp1 (w1) interleaves gate and up rows, the op's swiglu form
    (with its alpha 1.702 and limit 7.0); mlp2 is w2.

    Returns:
        ``(w, w_scale)``: uint8 ``[..., rows, cols / 2]`` and ``[..., rows, cols / 32]``.

    Raises:
        ValueError: a tensor of another dtype or shape, or a scale byte of 255
            (NaN in E8M0), naming it.
    """
    bytes_per_block = MXFP4_BLOCK // 2
    if blocks.dtype != torch.uint8 or blocks.dim() < 3 or blocks.shape[-1] != bytes_per_block:
        raise ValueError(f"blocks: expected uint8 [..., rows, cols / 32, {bytes_per_block}], got {blocks.dtype} "
                         f"{list(blocks.shape)}")
    if scales.dtype != torch.uint8:
        raise ValueError(f"scales: expected uint8 E8M0, got {scales.dtype}")
    _check_shape("scales", scales, tuple(blocks.shape[:-1]), "one per block of blocks")
    if bool((scales == E8M0_NAN).any()):
        raise ValueError(f"scales: byte {E8M0_NAN} (NaN in E8M0) is not a scale")
    return blocks.flatten(-2).contiguous(), scales.contiguous()
