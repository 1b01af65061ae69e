"""Text for language modelling (``prepare.dataset: text``): UTF-8 files read as byte-level tokens, split by position.

``prepare.raw_dir`` is a file or a folder. A folder's regular files are read in sorted path order, recursively;
hidden files are skipped, a link is read once (by the file it points to: Debian's fortunes has a ``.u8`` link
beside every file), and binary files (a NUL byte in their first 8 kB: the fortunes ``.dat`` indexes) are skipped
and counted. A file that is neither binary nor UTF-8, or text that is empty, stops the stage with one line naming
it. Tokens are the UTF-8 bytes (a 256-symbol vocabulary, nothing to download); the concatenated text is cut by
position into train, then validation (``prepare.val_fraction``), then test (``prepare.test_fraction``): no
sequence straddles two splits, and the test text is text no training sequence saw. Stored as uint8.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampbench.errors import DataError

VOCAB_SIZE = 256  # byte-level tokens
BINARY_SNIFF = 8192  # a NUL byte within this many leading bytes marks a binary file (as git decides)


def text_files(raw: Path) -> tuple[list[Path], list[Path]]:
    """(the text files under ``raw``, in reading order; the binary files skipped)."""
    if raw.is_file():
        return [raw], []
    if not raw.is_dir():
        raise DataError(f"prepare.raw_dir: {raw} is neither a text file nor a folder of text files")
    seen, texts, binary = set(), [], []
    for path in sorted(raw.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(raw).parts) or not path.is_file():
            continue
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        with open(path, "rb") as f:
            (binary if b"\0" in f.read(BINARY_SNIFF) else texts).append(path)
    return texts, binary


def read_tokens(raw: Path) -> tuple[torch.Tensor, dict]:
    """Every text file under ``raw`` as one uint8 tensor of UTF-8 bytes, and what was read (files, skipped)."""
    files, binary = text_files(raw)
    if not files:
        raise DataError(f"prepare.raw_dir: no text file in {raw}" + (f" ({len(binary)} binary files skipped)"
                                                                     if binary else ""))
    chunks = []
    for path in files:
        blob = path.read_bytes()
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text (byte {exc.start}: {blob[exc.start:exc.start + 1]!r}); "
                            "convert it (iconv -t UTF-8) or move it out of prepare.raw_dir") from None
        chunks.append(blob)
    data = b"".join(chunks)
    if not data.strip():
        raise DataError(f"prepare.raw_dir: the text in {raw} is empty")
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tokens, {"files": len(files), "binary_files_skipped": len(binary), "bytes": len(data)}


def split_by_position(tokens: torch.Tensor, val_fraction: float, test_fraction: float) -> dict[str, torch.Tensor]:
    """train = the first part, val the next ``val_fraction``, test the last ``test_fraction`` of the tokens."""
    n = len(tokens)
    n_val, n_test = int(round(val_fraction * n)), int(round(test_fraction * n))
    n_train = n - n_val - n_test
    return {"train": tokens[:n_train].clone(), "val": tokens[n_train:n_train + n_val].clone(),
            "test": tokens[n_train + n_val:].clone()}


def sequences(tokens: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping sequences of ``block_size`` tokens and their next tokens: (x, y), both (N, block_size)
    views of ``tokens`` (no copy), N = (len − 1) // block_size; the tail that fills no whole sequence is left."""
    n = (len(tokens) - 1) // block_size
    return tokens[:n * block_size].view(n, block_size), tokens[1:n * block_size + 1].view(n, block_size)
