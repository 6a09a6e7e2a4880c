"""The edit that drifts a scratch copy of the tree, for the drift proofs."""

from __future__ import annotations

from pathlib import Path


def source_to_drift(tree: Path, source: str, pristine: str) -> str:
    """tree/source's text, which must hold exactly one `pristine`, the text a drift replaces."""
    text = (tree / source).read_text()
    assert text.count(pristine) == 1, (
        f"{source} no longer has exactly one {pristine!r}, the text this drift proof edits: "
        "update the proof's pristine and drifted texts to the source as it is now")
    return text


def drift_source(tree: Path, source: str, pristine: str, drifted: str) -> str:
    """Replaces the one `pristine` text of tree/source with `drifted`; returns the file's text before."""
    text = source_to_drift(tree, source, pristine)
    (tree / source).write_text(text.replace(pristine, drifted))
    return text
