"""A flat token file on any fsspec filesystem, read by byte ranges, in a seeded sample order.

Why: a pod must train on a corpus far larger than its memory, kept in a bucket (`gs://`) or
on a volume, and each data-parallel replica should read only the bytes of its own samples.
Called by sailplan.trainer.data (make_source) for a DataConfig of kind token-file.

Format (nanoGPT's `train.bin`): the tokens back to back, little-endian, nothing else. An
optional sidecar `<url>.json` gives `{"dtype": "uint16" | "uint32", "tokens": N}`; without
it the dtype is uint16 when the vocabulary fits in 16 bits, else uint32 (what a tokenizer
writing the file would choose), and the count is the file size over the token size. A file
shorter than its sidecar says, or not a whole number of tokens, is refused as truncated.

Samples: window w is the `sequence_length + 1` tokens starting at token
`w * sequence_length` (consecutive windows share one token, so every token is a target
once). Sample i reads window `perm_e(i mod W)` of epoch `e = i div W`, where perm_e is a
permutation of the W windows keyed by (seed, e): sample i is a pure function of (seed, i),
so every plan, every replica split and every resume reads the same global sequence. The
permutation is a Feistel network with cycle walking (O(1) memory, any W), not a shuffled
array, so a corpus of billions of windows costs nothing to open.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from fsspec.core import url_to_fs
from numpy.typing import NDArray

# Feistel rounds: 4 rounds of a good round function give a pseudorandom permutation (Luby and
# Rackoff, 1988); a shuffle only needs to look random, 4 is plenty.
_ROUNDS = 4
# SplitMix64's finaliser (Steele, Lea and Flood, OOPSLA 2014), used as the round function.
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {"uint16": np.uint16, "uint32": np.uint32}


class DataError(RuntimeError):
    """A token file that cannot be read as promised; the message is one line naming the URL."""


def _mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


class WindowOrder:
    """A permutation of range(windows) per epoch, keyed by (seed, epoch)."""

    def __init__(self, windows: int, seed: int) -> None:
        self.windows = windows
        self.seed = seed
        # the smallest even bit width whose domain holds every window: < 4 x windows, so
        # cycle walking takes fewer than 4 passes on average
        bits = max(2, (windows - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self._keys: dict[int, NDArray[np.uint64]] = {}

    def _round_keys(self, epoch: int) -> NDArray[np.uint64]:
        if epoch not in self._keys:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            self._keys[epoch] = rng.integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)
        return self._keys[epoch]

    def _encrypt(self, x: NDArray[np.uint64], keys: NDArray[np.uint64]) -> NDArray[np.uint64]:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << half) | right

    def __call__(self, positions: NDArray[np.int64], epoch: int) -> NDArray[np.int64]:
        """The windows at these positions (each in range(windows)) of the epoch's order."""
        keys = self._round_keys(epoch)
        out = self._encrypt(positions.astype(np.uint64), keys)
        outside = out >= np.uint64(self.windows)
        while outside.any():  # cycle walking: re-encrypt until back inside range(windows)
            out[outside] = self._encrypt(out[outside], keys)
            outside = out >= np.uint64(self.windows)
        return out.astype(np.int64)


class FsspecTokens:
    """Samples of a token file at an fsspec URL; each read fetches only its windows' bytes."""

    def __init__(self, url: str, vocab_size: int, sequence_length: int, seed: int) -> None:
        self.url = url
        self.vocab_size = vocab_size
        self.length = sequence_length + 1
        self.stride = sequence_length
        try:
            self.fs, self.path = url_to_fs(url)
            size = int(self.fs.size(self.path))
        except FileNotFoundError:
            raise DataError(f"token file {url}: not found") from None
        except (ImportError, ValueError, OSError) as error:
            raise DataError(f"token file {url}: {_one_line(error)}") from None
        dtype_name, tokens = self._describe(size)
        self.dtype = np.dtype(_DTYPES[dtype_name]).newbyteorder("<")
        self.tokens = tokens
        if tokens < self.length:
            raise DataError(
                f"token file {url}: {tokens} tokens, fewer than one sample ({self.length})"
            )
        self.windows = (tokens - self.length) // self.stride + 1
        self.order = WindowOrder(self.windows, seed)

    def _describe(self, size: int) -> tuple[str, int]:
        """(dtype name, token count) from the sidecar, else from the vocabulary and size."""
        sidecar = self.path + ".json"
        meta: dict[str, Any] | None = None
        try:
            if self.fs.exists(sidecar):
                meta = json.loads(self.fs.cat_file(sidecar))
        except (OSError, ValueError) as error:
            raise DataError(
                f"token file {self.url}: sidecar {sidecar}: {_one_line(error)}"
            ) from None
        if meta is None:
            name = "uint16" if self.vocab_size <= 2**16 else "uint32"
            itemsize = np.dtype(_DTYPES[name]).itemsize
            if size % itemsize:
                raise DataError(
                    f"token file {self.url}: {size} bytes is not a whole number of {name} "
                    "tokens (truncated?)"
                )
            return name, size // itemsize
        name, tokens = str(meta.get("dtype")), meta.get("tokens")
        if name not in _DTYPES or not isinstance(tokens, int) or tokens < 0:
            raise DataError(
                f"token file {self.url}: sidecar {sidecar} needs dtype uint16|uint32 and a "
                f"token count, has {meta}"
            )
        if name == "uint16" and self.vocab_size > 2**16:
            raise DataError(
                f"token file {self.url}: uint16 tokens cannot hold vocabulary {self.vocab_size}"
            )
        expected = tokens * np.dtype(_DTYPES[name]).itemsize
        if size < expected:
            raise DataError(
                f"token file {self.url}: truncated, {size} bytes where its sidecar says "
                f"{tokens} {name} tokens ({expected} bytes)"
            )
        return name, tokens

    def windows_of(self, indices: Sequence[int]) -> NDArray[np.int64]:
        """The window each global sample index reads."""
        index = np.asarray(indices, dtype=np.int64)
        out = np.empty_like(index)
        epochs = index // self.windows
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            out[chosen] = self.order(index[chosen] % self.windows, int(epoch))
        return out

    def read(self, indices: Sequence[int]) -> NDArray[np.int64]:
        """Samples [len(indices), sequence_length + 1] as int64, one byte range per sample."""
        if len(indices) == 0:
            return np.empty((0, self.length), dtype=np.int64)
        itemsize = self.dtype.itemsize
        starts = [int(w) * self.stride * itemsize for w in self.windows_of(indices)]
        size = self.length * itemsize
        ends = [s + size for s in starts]
        try:
            # one request per sample; fsspec issues them concurrently on async stores (gcsfs)
            chunks = self.fs.cat_ranges([self.path] * len(starts), starts, ends, on_error="raise")
        except FileNotFoundError:
            raise DataError(f"token file {self.url}: not found (removed while training?)") from None
        except (OSError, ValueError) as error:
            raise DataError(f"token file {self.url}: read failed: {_one_line(error)}") from None
        for start, chunk in zip(starts, chunks, strict=True):
            if len(chunk) != size:
                raise DataError(
                    f"token file {self.url}: short read at byte {start}: {len(chunk)} of "
                    f"{size} bytes (truncated?)"
                )
        rows = np.frombuffer(b"".join(chunks), dtype=self.dtype).reshape(len(starts), self.length)
        batch = rows.astype(np.int64)
        if int(batch.max()) >= self.vocab_size:
            row = int(np.argmax(batch.max(axis=1)))
            raise DataError(
                f"token file {self.url}: token {int(batch[row].max())} at byte {starts[row]} "
                f"is outside the vocabulary ({self.vocab_size})"
            )
        return batch

    def sample(self, index: int) -> NDArray[np.int64]:
        row: NDArray[np.int64] = self.read([index])[0]
        return row


def _one_line(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return " ".join(text.split())
