"""RFC 6962 / RFC 9162 Merkle trees over the ledger: roots, inclusion and consistency proofs.

Leaves are byte strings; for the ledger each leaf is an entry's hash as its **raw 32 bytes**
(``bytes.fromhex(entry.hash)``), so leaf ``i`` of a tree of size ``n`` is ledger entry
``seq = i + 1``. Hashing is the RFC's: ``leaf = sha256(0x00 || data)``, ``node = sha256(0x01 ||
left || right)``, and a tree of ``n`` leaves splits at the largest power of two below ``n``.
The tree of no leaves has the root ``sha256(b"")``.

:func:`root` streams (one pass, a stack of at most log2(n) hashes), so ten million leaves cost
twenty million sha256 calls and no memory beyond the iterator. :class:`Tree` keeps every level
(64 bytes per leaf in all) to answer many proofs quickly; :func:`inclusion_proof` and
:func:`consistency_proof` are shorthands that build one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root(leaves: Iterable[bytes]) -> bytes:
    """The tree head of LEAVES, streaming: a stack of (height, hash) of complete subtrees."""
    # The complete subtrees left on the stack are the binary digits of n, largest first; the
    # RFC's split joins them right to left.
    f = Frontier()
    f.extend(leaves)
    return f.root()


class Frontier:
    """The streaming :func:`root` kept open: the complete subtrees over the leaves so far (at
    most log2(n) hashes), so a tree head after more leaves costs only the new leaves. What the
    verifier signs its checkpoints from: each one extends the last by the entries since."""

    def __init__(self) -> None:
        self.size = 0
        self._heights: list[int] = []
        self._hashes: list[bytes] = []

    def extend(self, leaves: Iterable[bytes]) -> None:
        """Append LEAVES (leaf data, hashed here)."""
        heights, hashes, sha = self._heights, self._hashes, hashlib.sha256
        for leaf in leaves:
            h = sha(b"\x00" + leaf).digest()
            height = 0
            while heights and heights[-1] == height:
                heights.pop()
                h = sha(b"\x01" + hashes.pop() + h).digest()
                height += 1
            heights.append(height)
            hashes.append(h)
            self.size += 1

    def root(self) -> bytes:
        if not self._hashes:
            return EMPTY_ROOT
        h = self._hashes[-1]
        for left in reversed(self._hashes[:-1]):
            h = node_hash(left, h)
        return h


class Proofs:
    """Tree heads and RFC 9162 proofs from a tree's complete subtrees (``_node``): what
    :class:`Tree` (every level in memory) and ``servewitness.ledger.tiles`` (the levels above
    the ledger's tiles in memory, the leaves read when a proof reaches down to them) share."""

    @property
    def size(self) -> int:
        raise NotImplementedError

    def _node(self, level: int, index: int) -> bytes:
        """The complete subtree of 2**LEVEL leaves starting at leaf INDEX * 2**LEVEL."""
        raise NotImplementedError

    def leaf_hash(self, index: int) -> bytes:
        return self._node(0, index)

    def _subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for a range the RFC's recursion produces: START is a multiple of
        the largest power of two not above END - START, so the left parts are stored nodes."""
        n = end - start
        if n == 0:
            return EMPTY_ROOT
        if n & (n - 1) == 0:  # a complete subtree: stored
            height = n.bit_length() - 1
            return self._node(height, start >> height)
        k = 1 << ((n - 1).bit_length() - 1)
        return node_hash(self._subtree(start, start + k), self._subtree(start + k, end))

    def root(self, size: int | None = None) -> bytes:
        """The tree head at SIZE (default: all leaves)."""
        size = self.size if size is None else size
        self._check_size(size)
        return self._subtree(0, size)

    def _check_size(self, size: int) -> None:
        if not 0 <= size <= self.size:
            raise ValueError(f"tree size {size} outside 0..{self.size}")

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """The audit path of leaf INDEX in the tree of SIZE leaves, bottom up (RFC 9162
        §2.1.3.1)."""
        size = self.size if size is None else size
        self._check_size(size)
        if not 0 <= index < size:
            raise ValueError(f"leaf index {index} outside 0..{size - 1}")
        proof: list[bytes] = []
        start, end = 0, size
        # Walk down from the root, collecting the sibling subtrees; they come out top down.
        while end - start > 1:
            k = 1 << ((end - start - 1).bit_length() - 1)
            if index < start + k:
                proof.append(self._subtree(start + k, end))
                end = start + k
            else:
                proof.append(self._subtree(start, start + k))
                start = start + k
        proof.reverse()
        return proof

    def consistency_proof(self, first: int, second: int | None = None) -> list[bytes]:
        """Proof that the tree of FIRST leaves is a prefix of the tree of SECOND leaves (RFC
        9162 §2.1.4.1). Empty when FIRST is 0 or equal to SECOND."""
        second = self.size if second is None else second
        self._check_size(second)
        if not 0 <= first <= second:
            raise ValueError(f"first size {first} outside 0..{second}")
        if first in (0, second):
            return []
        proof: list[bytes] = []
        start, end, m, whole = 0, second, first, True
        while m != end - start:  # SUBPROOF(m, D[start:end], whole)
            k = 1 << ((end - start - 1).bit_length() - 1)
            if m <= k:
                proof.append(self._subtree(start + k, end))
                end = start + k
            else:
                proof.append(self._subtree(start, start + k))
                start, m, whole = start + k, m - k, False
        if not whole:
            proof.append(self._subtree(start, end))
        proof.reverse()
        return proof


class Tree(Proofs):
    """Every level of the tree over some leaves, for proofs against any size up to its own.

    Level 0 holds the leaf hashes; level k+1 pairs level k, carrying an odd last node up
    unchanged, which gives exactly the RFC's tree for every size."""

    def __init__(self, leaves: Iterable[bytes] = (), *, leaf_hashes: bool = False) -> None:
        """LEAVES are leaf data (hashed here), or leaf hashes already when LEAF_HASHES."""
        level = bytearray()
        for leaf in leaves:
            if leaf_hashes:
                if len(leaf) != HASH_SIZE:
                    raise ValueError("a leaf hash is 32 bytes")
                level += leaf
            else:
                level += leaf_hash(leaf)
        self._levels: list[bytes] = [bytes(level)]
        while len(self._levels[-1]) > HASH_SIZE:
            below = self._levels[-1]
            n = len(below) // HASH_SIZE
            up = bytearray()
            for i in range(0, n - 1, 2):
                up += node_hash(
                    below[i * HASH_SIZE : (i + 1) * HASH_SIZE],
                    below[(i + 1) * HASH_SIZE : (i + 2) * HASH_SIZE],
                )
            if n % 2:
                up += below[(n - 1) * HASH_SIZE :]
            self._levels.append(bytes(up))

    @property
    def size(self) -> int:
        return len(self._levels[0]) // HASH_SIZE

    def _node(self, level: int, index: int) -> bytes:
        data = self._levels[level]
        return data[index * HASH_SIZE : (index + 1) * HASH_SIZE]


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path of LEAVES[INDEX] in the tree of all LEAVES (leaf data, not hashes)."""
    return Tree(leaves).inclusion_proof(index)


def consistency_proof(
    leaves: Sequence[bytes], first: int, second: int | None = None
) -> list[bytes]:
    """Proof that the tree of LEAVES[:FIRST] is a prefix of the tree of LEAVES[:SECOND]."""
    return Tree(leaves[: len(leaves) if second is None else second]).consistency_proof(first)


def _shift_while_even(fn: int, sn: int) -> tuple[int, int]:
    while not fn & 1 and fn != 0:
        fn >>= 1
        sn >>= 1
    return fn, sn


def verify_inclusion_hash(
    leaf_h: bytes, index: int, size: int, proof: Sequence[bytes], root_h: bytes
) -> bool:
    """RFC 9162 §2.1.3.2 with the leaf's hash already computed."""
    if not 0 <= index < size or any(len(p) != HASH_SIZE for p in proof):
        return False
    fn, sn, r = index, size - 1, leaf_h
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                fn, sn = _shift_while_even(fn, sn)
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root_h


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether LEAF (leaf data) is leaf INDEX of the tree of SIZE leaves whose head is ROOT."""
    return verify_inclusion_hash(leaf_hash(leaf), index, size, proof, root)


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether the tree of FIRST leaves with head FIRST_ROOT is a prefix of the tree of SECOND
    leaves with head SECOND_ROOT (RFC 9162 §2.1.4.2)."""
    if not 0 <= first <= second or any(len(p) != HASH_SIZE for p in proof):
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof and first_root == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                fn, sn = _shift_while_even(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == first_root and sr == second_root and sn == 0
