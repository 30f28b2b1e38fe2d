"""The ledger's Merkle tree as a running verifier keeps it: tree heads and RFC 9162 proofs at
any size without reading the whole ledger.

Why: :class:`merkle.Tree` holds every level (64 bytes per entry) and was built from the whole
ledger for every audit answer and every window seal, and the stored checkpoints were checked
by hashing the whole ledger again: about 3.6 us per entry per call, under the store's lock,
so a verifier with a million entries (half an hour at 600 entries/s) stopped ingesting for
seconds per seal, and a day's ledger for minutes, in gigabytes.

:class:`Tiles` keeps the complete subtrees of ``2**height`` leaves (a *tile*) and every
complete subtree above them, 64 bytes per tile in all, plus the leaf hashes of the last,
incomplete tile, and grows by the entries appended. A :class:`TileView` answers proofs from
them; where a proof reaches below a tile it reads that tile's leaves (``read``) and checks
that they hash to the subtree kept for it: an entry rewritten behind the verifier is named
(:class:`TileRewritten`), never proved. :class:`KeptTree` is the verifier's: built once from
the ledger with every stored checkpoint checked against it (what the whole-ledger check did
per call), then brought up to date with the entries appended since and the checkpoints stored
since, each checked when first seen.

What this no longer sees per call: an old entry rewritten behind a running verifier that no
answer touches. Answers and seals are still over the tree as the verifier built it (the
rewrite is not laundered: the note it signs has the old root), an answer that touches the
entry is refused, and a restart or ``verifier audit verify`` checks the whole ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from servewitness.ledger import merkle
from servewitness.ledger.interface import Database
from servewitness.ledger.keys import Ed25519PublicKey

TILE_HEIGHT = 8  # 256 entries per tile: 64 bytes kept per 256 entries, 256 read per proof leg
H = merkle.HASH_SIZE


class TileRewritten(Exception):
    """The entries of a tile, read now, no longer hash to the subtree this verifier kept."""


def _mth(level: list[bytes]) -> bytes:
    """The root of a complete subtree over LEVEL (leaf hashes, a power of two of them)."""
    while len(level) > 1:
        level = [merkle.node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


class Tiles:
    """Complete subtrees of ``2**height`` leaves and above, and the last tile's leaf hashes."""

    def __init__(self, height: int = TILE_HEIGHT) -> None:
        self.height = height
        self.size = 0
        # _levels[k]: the complete subtrees of 2**(height + k) leaves, in order, concatenated
        self._levels: list[bytearray] = []
        self._tail: list[bytes] = []  # leaf hashes of the incomplete last tile
        self.last = b""  # the last leaf's data (the newest entry's hash)

    @property
    def tiles(self) -> int:
        """Complete tiles."""
        return len(self._levels[0]) // H if self._levels else 0

    def extend(self, leaves: Iterable[bytes]) -> None:
        """Append LEAVES (leaf data: a ledger entry's hash as 32 raw bytes)."""
        whole = 1 << self.height
        for leaf in leaves:
            self._tail.append(merkle.leaf_hash(leaf))
            self.size += 1
            self.last = leaf
            if len(self._tail) == whole:
                self._push(_mth(self._tail))
                self._tail = []

    def _push(self, node: bytes) -> None:
        k = 0
        while True:
            if k == len(self._levels):
                self._levels.append(bytearray())
            level = self._levels[k]
            level += node
            if (len(level) // H) % 2:
                return
            node = merkle.node_hash(bytes(level[-2 * H : -H]), bytes(level[-H:]))
            k += 1

    def tail(self) -> list[bytes]:
        """The leaf hashes of the incomplete last tile (a copy)."""
        return list(self._tail)

    def kept(self, level: int, index: int) -> bytes:
        """The complete subtree of 2**LEVEL leaves at INDEX, LEVEL >= height."""
        data = self._levels[level - self.height]
        return bytes(data[index * H : (index + 1) * H])

    def view(self, read: Callable[[int, int], Sequence[bytes]]) -> TileView:
        """Proofs over the tree as it is now; READ(start, end): leaves START..END-1 (leaf data
        of entries seq START+1..END), from the database, for what lies below a tile."""
        return TileView(self, read)


class TileView(merkle.Proofs):
    """Tree heads and proofs over :class:`Tiles` at its size when made (it may grow after)."""

    def __init__(self, tiles: Tiles, read: Callable[[int, int], Sequence[bytes]]) -> None:
        self._tiles = tiles
        self._read = read
        self._size = tiles.size
        self._whole = tiles.tiles  # complete tiles at this size
        self._tail = tiles.tail()
        self._read_tiles: dict[int, list[bytes]] = {}  # tile -> its leaf hashes, checked

    @property
    def size(self) -> int:
        return self._size

    def _node(self, level: int, index: int) -> bytes:
        height = self._tiles.height
        if level >= height:
            return self._tiles.kept(level, index)
        first = index << level
        tile = first >> height
        leaves = self._tail if tile == self._whole else self._leaves_of(tile)
        offset = first - (tile << height)
        return _mth(leaves[offset : offset + (1 << level)])

    def _leaves_of(self, tile: int) -> list[bytes]:
        got = self._read_tiles.get(tile)
        if got is None:
            height = self._tiles.height
            start, end = tile << height, (tile + 1) << height
            got = [merkle.leaf_hash(leaf) for leaf in self._read(start, end)]
            if len(got) != end - start or _mth(got) != self._tiles.kept(height, tile):
                raise TileRewritten(
                    f"ledger entries {start + 1}..{end} no longer hash to the tree this "
                    "verifier kept of them: rewritten behind it"
                )
            self._read_tiles[tile] = got
        return got


def read_leaves(db: Database) -> Callable[[int, int], list[bytes]]:
    """``Tiles.view``'s READ over the ledger table of DB."""

    def read(start: int, end: int) -> list[bytes]:
        rows = db.execute(
            "SELECT hash FROM ledger WHERE seq > ? AND seq <= ? ORDER BY seq", (start, end)
        )
        return [bytes.fromhex(str(h)) for (h,) in rows]

    return read


class KeptTree:
    """The ledger's tree as one verifier keeps it across calls (call with the store's lock
    held, inside one snapshot): :meth:`current` brings it up to date and checks every stored
    checkpoint not checked yet, raising :class:`Rewritten` when the ledger is no longer what
    was signed."""

    def __init__(self, height: int = TILE_HEIGHT) -> None:
        self._height = height
        self._tiles: Tiles | None = None
        self._checked = 0  # checkpoints rows (rowid) checked against the tree, up to this one

    def forget(self) -> None:
        """Build it again from the whole ledger next time."""
        self._tiles, self._checked = None, 0

    def current(self, db: Database, key: Ed25519PublicKey) -> TileView:
        from servewitness.ledger import checkpoints

        try:
            return self._current(db, key)
        except (checkpoints.NotAppendOnly, ValueError) as e:
            self.forget()  # read from the whole ledger again next time
            if isinstance(e, checkpoints.NotAppendOnly):
                raise
            raise checkpoints.NotAppendOnly(f"a ledger hash is not a hash: {e}") from e

    def _current(self, db: Database, key: Ed25519PublicKey) -> TileView:
        from servewitness.ledger import checkpoints

        if self._tiles is None:
            self._tiles, self._checked = Tiles(self._height), 0
        tiles = self._tiles
        size_row = db.execute("SELECT MAX(seq) FROM ledger").fetchone()
        size = int(size_row[0]) if size_row and size_row[0] is not None else 0
        if size < tiles.size:
            raise checkpoints.NotAppendOnly(
                f"the ledger has {size} entries, fewer than the {tiles.size} this verifier "
                "read: entries were deleted behind its back"
            )
        # Every entry's hash covers the one before (``prev``): a rewrite that leaves the chain
        # verifying on its own changed the newest entry this verifier read. New entries must
        # go on from it.
        prev = tiles.last.hex()
        if tiles.size:
            row = db.execute("SELECT hash FROM ledger WHERE seq = ?", (tiles.size,)).fetchone()
            if row is None or str(row[0]) != prev:
                raise checkpoints.NotAppendOnly(
                    f"ledger entry {tiles.size} is not the one this verifier read: the chain "
                    "was rewritten behind it"
                )
        fresh: list[bytes] = []
        for seq, before, h in db.execute(
            "SELECT seq, prev, hash FROM ledger WHERE seq > ? AND seq <= ? ORDER BY seq",
            (tiles.size, size),
        ):
            if int(seq) != tiles.size + len(fresh) + 1:
                raise checkpoints.NotAppendOnly(f"ledger entries are missing below entry {seq}")
            if tiles.size + len(fresh) and str(before) != prev:
                raise checkpoints.NotAppendOnly(
                    f"ledger entry {seq} does not go on from entry {int(seq) - 1}: the chain "
                    "was rewritten"
                )
            prev = str(h)
            fresh.append(bytes.fromhex(prev))
        tiles.extend(fresh)
        if tiles.size != size:
            raise checkpoints.NotAppendOnly(f"ledger entries are missing below entry {size}")
        view = tiles.view(read_leaves(db))
        checked, problem = checkpoints.check_new(db, view, key, self._checked)
        if problem is not None:
            raise checkpoints.NotAppendOnly(problem)
        self._checked = checked
        return view
