"""The top-k computation of the example, free of dtq: load, split, per-chunk top-k, merge, CSV.

The data set is scikit-learn's bundled ``load_digits`` (1797 rows of 64 pixel intensities, each
an integer 0-16, plus the digit label), read from the installed wheel, never downloaded. With
integer features every squared Euclidean distance is an exact integer, so every process computes
the very same numbers and the merged result is reproducible bit for bit.

A neighbour is ``(distance, row)``: the k nearest rows to a query are the k smallest pairs, so
ties on the distance are broken by the lower row index. The query row itself is excluded.
"""

from __future__ import annotations

import csv
import functools
import heapq
import io
from collections.abc import Iterable, Sequence

#: One neighbour of a query: (squared Euclidean distance, row index).
Neighbour = tuple[int, int]

MAX_K = 100
MAX_QUERIES = 200


@functools.lru_cache(maxsize=1)
def load_rows() -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The digits data set as ``(rows, labels)``: 1797 tuples of 64 ints, and 1797 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = tuple(tuple(int(v) for v in row) for row in digits.data)
    labels = tuple(int(v) for v in digits.target)
    return rows, labels


def query_rows(queries: int, n_rows: int) -> list[int]:
    """The row indices of ``queries`` query rows, evenly spaced over ``n_rows`` rows.

    Raises:
        ValueError: ``queries`` is not in 1..min(MAX_QUERIES, n_rows).
    """
    if not 1 <= queries <= min(MAX_QUERIES, n_rows):
        raise ValueError(f"queries must be 1..{min(MAX_QUERIES, n_rows)}, got {queries}")
    return [i * n_rows // queries for i in range(queries)]


def chunk_bounds(chunk: int, chunks: int, n_rows: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of chunk ``chunk`` of ``chunks`` near-equal chunks.

    Raises:
        ValueError: ``chunks`` is not in 1..n_rows or ``chunk`` not in 0..chunks-1.
    """
    if not 1 <= chunks <= n_rows:
        raise ValueError(f"chunks must be 1..{n_rows}, got {chunks}")
    if not 0 <= chunk < chunks:
        raise ValueError(f"chunk must be 0..{chunks - 1}, got {chunk}")
    return chunk * n_rows // chunks, (chunk + 1) * n_rows // chunks


def check_k(k: int) -> None:
    """Raises ValueError unless ``k`` is in 1..MAX_K."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be 1..{MAX_K}, got {k}")


def _distance(a: Sequence[int], b: Sequence[int]) -> int:
    return sum((x - y) * (x - y) for x, y in zip(a, b, strict=True))


def chunk_topk(
    rows: Sequence[Sequence[int]], start: int, stop: int, queries: Sequence[int], k: int
) -> list[list[Neighbour]]:
    """For each query row index, its k nearest rows among ``rows[start:stop]`` (fewer if the
    chunk is smaller), as ``(distance, row)`` pairs in ascending order."""
    out: list[list[Neighbour]] = []
    for q in queries:
        target = rows[q]
        candidates = ((_distance(target, rows[i]), i) for i in range(start, stop) if i != q)
        out.append(heapq.nsmallest(k, candidates))
    return out


def merge(partials: Iterable[Sequence[Sequence[Neighbour]]], k: int) -> list[list[Neighbour]]:
    """Merge per-chunk top-k lists (each a list per query) into the global top-k per query."""
    merged: list[list[Neighbour]] | None = None
    for partial in partials:
        if merged is None:
            merged = [[] for _ in partial]
        if len(partial) != len(merged):
            raise ValueError("partial results disagree on the number of queries")
        for q, neighbours in enumerate(partial):
            merged[q].extend((int(d), int(i)) for d, i in neighbours)
    if merged is None:
        raise ValueError("no partial results to merge")
    return [heapq.nsmallest(k, neighbours) for neighbours in merged]


def to_csv(
    queries: Sequence[int], topk: Sequence[Sequence[Neighbour]], labels: Sequence[int]
) -> bytes:
    """The result as CSV bytes: ``query,query_row,query_label,rank,row,label,distance``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["query", "query_row", "query_label", "rank", "row", "label", "distance"])
    for n, (q, neighbours) in enumerate(zip(queries, topk, strict=True)):
        for rank, (distance, row) in enumerate(neighbours, start=1):
            writer.writerow([n, q, labels[q], rank, row, labels[row], distance])
    return buffer.getvalue().encode()


def single_process_csv(k: int, queries: int) -> bytes:
    """The whole computation in one pass, no chunks: what the pipeline must reproduce."""
    rows, labels = load_rows()
    check_k(k)
    picked = query_rows(queries, len(rows))
    return to_csv(picked, chunk_topk(rows, 0, len(rows), picked, k), labels)
