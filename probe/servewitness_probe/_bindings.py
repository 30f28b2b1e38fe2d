"""Request bindings: which engine steps served which request, and which external id is which
internal one. Both go to the process's ``bindings.jsonl`` (format in ``layout``).

* In the process that runs engine steps, ``step()`` (called from ``_vllm._count_step``) keeps
  one open entry per internal request id seen in ``scheduler_output.num_scheduled_tokens``
  and closes it when the id shows up in ``scheduler_output.finished_req_ids`` (ids finished
  since the previous step; vLLM schedules a step, empty if need be, to announce them). A
  closed entry becomes one ``"req"`` record.
* In the API server, ``_extids`` adds one ``"ext"`` record per internal id (its external id),
  through this module's buffer and writer.
* Speculation per request (``_specshare``) is shared out by the same fold and closed with
  the request's entry.

Cost per step: ``step()`` only appends references to the step's ``num_scheduled_tokens`` and
``finished_req_ids`` to a log (and reads the hook counters in a step that admits or finishes
requests); ``fold()`` does the per-request work in the writer thread, off the step (on a GPU
worker, while the step thread waits on the device without the GIL), or in the step when
``LOG_MAX`` steps are waiting (the writer fell behind).

Records are buffered and written in batches, one ``os.write`` each, by the writer thread
every ``FLUSH_INTERVAL_S``, from the step when ``BATCH`` records are waiting after a fold there
(never blocking: if the writer holds a lock, the step leaves the work to it), and at exit
(``atexit`` and multiprocessing's finalizers, which are what runs in a vLLM worker), when the
requests still open are written with ``"end": "open"``. Nothing here raises into vLLM.

Steady steps (every open request scheduled again, one token each but a few; or 1 + K each,
a uniform speculative step) are folded without touching the requests that merely go on
(``_fold_steady``): the fold's work follows what changed (requests opened, closed, or not
plain), not the batch.

Size: one module because the step's log, the fold's table (with its steady-step epoch) and
the writer share state under one lock, read as module globals on the step's path; the API
server's half (``_extids``) and the speculation shares (``_specshare``) have moved out.
"""

from __future__ import annotations

import atexit
import json
import operator
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from servewitness_probe import _core, _specshare
from servewitness_probe import layout as L
from servewitness_probe._specshare import _spec_log, _spec_open, spec_step

# where ``_vllm``, the benchmark and the tests find them (the same objects, never rebound)
__all__ = ["_spec_log", "_spec_open", "spec_step"]

MAX_OPEN = 100_000  # open requests tracked at once; beyond that, S_BIND_OVERFLOW counts
LOG_MAX = 1024  # steps logged before the step itself folds them in
BATCH = 256  # records waiting before the step itself writes them
FLUSH_INTERVAL_S = 0.5

# Steps not folded into the table yet: (step, unix ns, files, num_scheduled_tokens,
# finished_req_ids, hook snapshot or None, the scheduler output). Bound as a default
# argument of step().
_log: deque[tuple[int, int, int, Any, Any, Any, Any]] = deque()
# Open requests by internal id: [s0, s1, n, tok, t0, t1, f0, f1, hook snapshot at s0, epoch,
# epoch tokens]:
# their counts so far, less what the steady steps since EPOCH add (``_settle``).
_open: dict[str, list[Any]] = {}
# Steady steps (``_fold_steady``): every open request is scheduled, each with one token but
# the few in ``_irregular`` (and the new ones). Each adds one step and one token to every open
# request without touching it: ``_epoch`` counts them, ``_epoch_last`` is the latest one's
# (step, unix ns, files). ``_steady``: the latest folded step scheduled every open request.
_epoch = 0
_epoch_tok = 0  # tokens each open request was scheduled by the steady steps so far
_epoch_last: tuple[int, int, int] = (0, 0, 0)
_steady = False
_irregular: dict[str, None] = {}
_hooks: list[Any] = [(), ()]  # hook names, their slot bases (declaration order)
_getter: list[Any] = [None, None]  # the slot bases and their itemgetter (two or more)
_last_snap: list[Any] = [None]  # the latest hook snapshot folded (fallback for a new id)
# Records waiting to be written: ("req", ...) tuples or ready "ext" dicts.
_buf: deque[Any] = deque()
_fold_lock = threading.Lock()
_flush_lock = threading.Lock()
_fd = -1
_fd_pid = 0
_writer_pid = 0
_atexit_done = False
_overflow_reported = False


def _hook_bases() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and slot bases of the hooks declared in this process (declaration order),
    cached while none is added."""
    st = _core.STATE
    names = st.hook_names if st is not None else {}
    if len(names) != len(_hooks[0]):
        bases = tuple(names.values())
        _hooks[:] = [tuple(names), bases]
        _getter[:] = [bases, operator.itemgetter(*bases) if len(bases) > 1 else None]
    return _hooks[0], _hooks[1]


def snapshot() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Every declared hook's name and fire count now (read by one ``itemgetter`` where there
    are two or more)."""
    names, bases = _hook_bases()
    if _getter[0] is bases and _getter[1] is not None:
        return names, _getter[1](_core.COUNTERS)
    return names, tuple(map(_core.COUNTERS.__getitem__, bases))


def step(
    so: Any,
    total: int,
    now: int,
    _log: deque[tuple[int, int, int, Any, Any, Any, Any]] = _log,
    _files: int = L.S_FILES_RECORDED,
    _snapshot: Callable[[], Any] = snapshot,
) -> None:
    """Log which requests step TOTAL (taken at NOW, unix ns) scheduled and which finished
    since the previous step. Runs on every step, so it only logs references (vLLM builds a
    new ``num_scheduled_tokens`` dict and hands over its ``finished_req_ids`` set each step,
    and nothing changes them afterwards); the hook counters are read only in a step that
    admits or finishes requests. ``fold()`` does the per-request work, off the step, in the
    writer thread. Never raises."""
    try:
        nst = so.num_scheduled_tokens
        fin = so.finished_req_ids
        if nst or fin:
            snap = None
            if fin or getattr(so, "scheduled_new_reqs", True):
                snap = _snapshot()
            _log.append((total, now, _core.COUNTERS[_files], nst, fin, snap, so))
            if len(_log) > LOG_MAX:
                fold(block=False)
    except Exception as e:  # noqa: BLE001 - a probe never raises into a step
        _core.report_error("bindings", f"{type(e).__name__}: {e}")


def take_back(total: int) -> None:
    """Drop step TOTAL's entry (its ``execute_model`` raised: it ran no step), unless the
    writer is folding now or has folded it already (then its requests keep one step more)."""
    if not _fold_lock.acquire(blocking=False):
        return
    global _steady
    try:
        if _log and _log[-1][0] == total:
            _log.pop()
            _steady = False  # its new requests continue unseen: the next step opens them
    finally:
        _fold_lock.release()


def fold(block: bool = True) -> None:
    """Fold the logged steps into the table of open requests, closing the finished ones
    into records. Consecutive steps that scheduled the same tokens to the same requests (a
    steady decode) are applied as one run. BLOCK=False (the step): give up at once when
    another thread folds."""
    if not _fold_lock.acquire(blocking=block):
        return
    try:
        _start_writer()
        _fold_all()
    except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
        _core.report_error("bindings", f"fold: {type(e).__name__}: {e}")
    finally:
        _fold_lock.release()
    if len(_buf) >= BATCH:
        flush(block=block)


def _fold_all() -> None:
    """Fold everything logged so far (the caller holds the fold lock): the steps logged so
    far, and then every speculative step logged by now (a request's finish is logged after
    its last output was, so its counts are all in when it closes)."""
    steps = len(_log)
    if _spec_log:
        _specshare.fold(len(_spec_log))
    _fold_steps(steps)
    _core.COUNTERS[L.S_BIND_OPEN] = len(_open)


def _fold_steps(steps: int) -> None:
    """Fold the first STEPS logged steps (the caller holds the fold lock). A steady step is
    folded without touching the requests that merely go on (``_fold_steady``); consecutive
    speculative steps that scheduled the same tokens to the same requests are applied as
    one run; any other step request by request."""
    global _steady, _epoch, _epoch_last, _epoch_tok
    uniform = _specshare.uniform_specs
    run: Any = None  # num_scheduled_tokens of the run, its first step and its length
    first: Any = None
    length = 0
    last: Any = None
    for _ in range(steps):
        entry = _log.popleft()
        step, now, files, nst, fin, snap, so = entry
        if snap is not None:
            _last_snap[0] = snap
        drafts: Any = getattr(so, "scheduled_spec_decode_tokens", None)
        even = False
        per = 1
        if drafts:
            even = bool(uniform) and _specshare.uniform_step(drafts)
            per = 1 + len(next(iter(drafts.values()))) if even else 0
        if run is None and _steady:
            if (
                not fin
                and (even or not _irregular)
                and len(nst) == len(_open)
                and getattr(so, "total_num_scheduled_tokens", -1) == per * len(nst)
                and not getattr(so, "scheduled_new_reqs", True)
            ):
                # the steadiest step: the same requests again (no new one, as many as are
                # open), one token each (see _steady_new), or each 1 + the K drafts of a
                # uniform speculative step (vLLM schedules a request at least 1 + its
                # drafts, so a total of 1 + K each is 1 + K each)
                _epoch += 1
                _epoch_tok += per
                _epoch_last = (step, now, files)
                continue
            if _fold_steady(entry):
                continue
        if run is not None and nst == run:
            length += 1
            last = (step, now, files)
        else:
            if run:
                _apply(run, first, length, last)
            run, length = nst, 1
            first = last = (step, now, files, _last_snap[0])
        if not fin and drafts and not even:
            _steady = False  # the run may go on (only a uniform one may be steady)
            continue
        complete = _apply(run, first, length, last) if run else True
        if fin:
            _close(fin, "finished", snap or _last_snap[0])
        run = None
        # The next step may be steady if this one scheduled every open request, and closed
        # none of them: an id new and finished in one step is closed at once, and continues
        # (in vLLM's eyes) unseen by the table until a step like this one opens it again.
        _steady = complete and len(_open) == len(nst) and not any(r in nst for r in fin or ())
    if run:
        _steady = _apply(run, first, length, last) and len(_open) == len(run)


def _fold_steady(entry: tuple[int, int, int, Any, Any, Any, Any]) -> bool:
    """Fold one logged step (ENTRY) that follows a step which scheduled every open request,
    if it is steady (``_steady_new``). Returns False, having changed nothing, if not."""
    global _epoch, _epoch_last, _epoch_tok
    step, now, files, nst, fin, snap, so = entry
    new = _steady_new(nst, fin, so)
    if new is None:
        return False
    if fin:
        _close(fin, "finished", snap or _last_snap[0])
    table = _open
    epoch, tok = _epoch, _epoch_tok
    for rid in tuple(_irregular):
        k = nst[rid]
        table[rid][3] += k - 1  # the epoch adds one
        if k == 1:
            del _irregular[rid]
    snap0 = _last_snap[0]
    for rid in new:
        k = nst[rid]
        table[rid] = [step, step, 0, k - 1, now, now, files, files, snap0, epoch, tok]
        if k != 1:
            _irregular[rid] = None
    _epoch, _epoch_tok = epoch + 1, tok + 1
    _epoch_last = (step, now, files)
    return True


def _steady_new(nst: Any, fin: Any, so: Any) -> list[str] | None:
    """The new request ids of a steady step, None if the step is not steady: every open
    request not finished is scheduled again, one token each but the ``_irregular`` ones,
    with no drafts, the new ones never seen. Told from the totals (vLLM schedules every
    request at least one token, so tokens that add up to one per request are one each) and
    the few requests that are not plain, never by looking at every request. This assumes
    every continuing request was admitted in a step folded here (the fold makes sure of it
    after a step it did not see: ``take_back``; an id new and finished at once); an id the
    table never saw can only make the counts disagree, unless an open request is missing
    at the same time."""
    try:
        reqs = so.scheduled_new_reqs
        new = [r.req_id for r in reqs] if reqs else []
        n_cont = len(so.scheduled_cached_reqs.req_ids)
        total = so.total_num_scheduled_tokens
        drafted = so.scheduled_spec_decode_tokens
    except AttributeError:
        return None
    table = _open
    if drafted or len(nst) != len(new) + n_cont or len(table) + len(new) > MAX_OPEN:
        return None
    n_fin = 0
    if fin:
        for rid in fin:
            if rid in table:
                n_fin += 1
    else:
        fin = ()
    irr_tok = irr_n = 0
    for rid in _irregular:
        k = nst.get(rid)
        if k is not None:
            irr_tok += k
            irr_n += 1
        elif rid not in fin:
            return None  # an open request left out of this step
    new_tok = 0
    for rid in new:
        k = nst.get(rid)
        if k is None or rid in table or rid in fin:
            return None
        new_tok += k
    if n_cont != len(table) - n_fin or total - new_tok - irr_tok != n_cont - irr_n:
        return None
    return new


def _settle(e: list[Any]) -> None:
    """Add to open entry E what the steady steps since its epoch added (one step, one token
    each; its latest step is the latest steady one)."""
    d = _epoch - e[9]
    if d:
        e[2] += d
        e[3] += _epoch_tok - e[10]
        e[1], e[5], e[7] = _epoch_last
        e[9], e[10] = _epoch, _epoch_tok


def _apply(nst: dict[str, int], first: Any, length: int, last: Any) -> bool:
    """LENGTH steps, from FIRST (step, ns, files, hook snapshot) to LAST (step, ns, files),
    each scheduled the tokens of NST. Every open entry is settled (``_settle``) first: the
    requests NST leaves out are not in the next steady steps. False if some request could
    not be tracked (``MAX_OPEN``)."""
    global _overflow_reported
    table = _open
    if _epoch_last[0] and any(o[9] != _epoch for o in table.values()):
        for o in table.values():
            _settle(o)
    irregular = _irregular
    irregular.clear()
    s1, t1, f1 = last[:3]
    complete = True
    for rid, k in nst.items():
        if k != 1:
            irregular[rid] = None
        e = table.get(rid)
        if e is not None:
            e[1] = s1
            e[2] += length
            e[3] += k * length
            e[5] = t1
            e[7] = f1
        elif len(table) < MAX_OPEN:
            s0, t0, f0, snap = first
            table[rid] = [s0, s1, length, k * length, t0, t1, f0, f1, snap, _epoch, _epoch_tok]
        else:
            complete = False
            irregular.pop(rid, None)
            _core.COUNTERS[L.S_BIND_OVERFLOW] += 1
            if not _overflow_reported:
                _overflow_reported = True
                _core.report_error("bindings", f"more than {MAX_OPEN} open requests")
    return complete


def _close(ids: Iterable[str], end: str, snap: Any) -> None:
    """Close the open entries of IDS into records waiting to be written."""
    for rid in ids:
        e = _open.pop(rid, None)
        spec = _spec_open.pop(rid, None) if _spec_open else None
        if e is not None:  # else never scheduled here, or not tracked (overflow)
            _settle(e)
            _irregular.pop(rid, None)
            _buf.append(("req", rid, e, snap, end, spec))


def _record(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    _, rid, e, snap, end, spec = item
    s0, s1, n, tok, t0, t1, f0, f1, snap0 = e[:9]
    names, fires = snap if snap is not None else ((), ())
    fires0 = snap0[1] if snap0 is not None else ()
    hooks = {name: fires[i] - (fires0[i] if i < len(fires0) else 0) for i, name in enumerate(names)}
    rec = {
        "k": "req",
        "id": rid,
        "s0": s0,
        "s1": s1,
        "n": n,
        "tok": tok,
        "t0": t0,
        "t1": t1,
        "f0": f0,
        "f1": f1,
        "hooks": hooks,
        "end": end,
    }
    if spec is not None:
        pos = spec[4:]
        while pos and not pos[-1]:
            pos.pop()
        rec["spec"] = {
            "drafts": spec[0],
            "draft_tokens": spec[1],
            "accepted": spec[2],
            "emitted": spec[3],
            "pos": pos,
        }
    return rec


# What json.dumps writes for a string (ensure_ascii: every character outside printable ASCII
# escaped), in C; hook names are few and repeat, so theirs are kept (in a plain dict:
# functools.lru_cache around _str made a record 0.33x json.dumps' time instead of 0.29x).
_str = json.encoder.encode_basestring_ascii
_names: dict[str, str] = {}


def _line(item: Any) -> str:
    """ITEM's record as one JSON line (no newline): the same text as ``json.dumps`` of
    ``_record(item)`` with compact separators, written without a dict or an encoder call for
    a request's record (~1.5 us instead of ~4.7 us: 256 requests' records per phase were half
    of the bindings' drain at batch 256). Anything else (an id map, a speculative request's
    record) goes through ``json.dumps``."""
    if isinstance(item, dict) or item[5] is not None or type(item[1]) is not str:
        return json.dumps(_record(item), separators=(",", ":"))
    _, rid, e, snap, end, _ = item
    s0, s1, n, tok, t0, t1, f0, f1, snap0 = e[:9]
    names, fires = snap if snap is not None else ((), ())
    fires0 = snap0[1] if snap0 is not None else ()
    parts = []
    for i, name in enumerate(names):
        q = _names.get(name)
        if q is None:
            q = _str(name)
            if len(_names) < 4096:  # bounded: hook names are the deployment's, and few
                _names[name] = q
        parts.append(f"{q}:{fires[i] - (fires0[i] if i < len(fires0) else 0)}")
    return (
        f'{{"k":"req","id":{_str(rid)},"s0":{s0},"s1":{s1},"n":{n},"tok":{tok},"t0":{t0},'
        f'"t1":{t1},"f0":{f0},"f1":{f1},"hooks":{{{",".join(parts)}}},"end":{_str(end)}}}'
    )


def _open_fd() -> int:
    """This process's ``bindings.jsonl``, created on first use, held open from then on (a
    reader takes it for the process's own only while the process holds it). A file already
    there was not created by this process (it is created once per process, in a directory
    created fresh): it is never written into, and the records are dropped (said once)."""
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd_pid == pid:
        if _fd >= 0:
            return _fd
        raise OSError(f"{L.BINDINGS_FILE} refused earlier in this process")
    st = _core.state()
    try:
        _fd = os.open(
            os.path.join(st.dir, L.BINDINGS_FILE),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
    except (FileExistsError, IsADirectoryError):
        _fd, _fd_pid = -1, pid  # planted: refused for good
        raise
    _fd_pid = pid
    st.emit({"k": "bindings_fd", "fd": _fd})  # a reader's hint (see layout)
    return _fd


def flush(block: bool = True) -> int:
    """Write every waiting record in one ``os.write``; returns how many. BLOCK=False (the
    step): give up at once when another thread is writing."""
    if not _flush_lock.acquire(blocking=block):
        return 0
    refused_before = _fd_pid == os.getpid() and _fd < 0
    try:
        items = []
        while _buf:
            items.append(_buf.popleft())  # only this lock's holder takes from the buffer
        if not items:
            return 0
        data = "".join(_line(i) + "\n" for i in items).encode()
        fd = _open_fd()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        _core.COUNTERS[L.S_BIND_WRITTEN] += len(items)
        return len(items)
    except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
        if not refused_before:
            _core.report_error("bindings", f"write: {type(e).__name__}: {e}")
        return 0
    finally:
        _flush_lock.release()


def _writer_loop() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_S)
        if _log:
            fold()
        if _buf:
            flush()


def start() -> None:
    """Start this process's writer thread (idempotent per pid). Never raises."""
    try:
        _start_writer()
    except Exception as e:  # noqa: BLE001 - a probe never raises into vLLM
        _core.report_error("bindings", f"start: {type(e).__name__}: {e}")


def _start_writer() -> None:
    """Start this process's writer thread and exit flush (once per pid; ``_vllm`` calls it
    when a worker is initialised, ``ext()`` and ``fold()`` call it too)."""
    global _writer_pid, _atexit_done
    pid = os.getpid()
    if _writer_pid == pid:
        return
    _writer_pid = pid
    if not _atexit_done:
        _atexit_done = True
        atexit.register(at_exit)
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        # A multiprocessing child (a vLLM worker) leaves through os._exit: atexit never runs
        # there, its finalizers do.
        try:
            mp_util.Finalize(None, at_exit, exitpriority=100)
        except Exception as e:  # noqa: BLE001
            _core.report_error("bindings", f"finalizer: {type(e).__name__}: {e}")
    threading.Thread(target=_writer_loop, name="verifier-probe-bindings", daemon=True).start()


def at_exit() -> None:
    """Close the requests still open as ``"end": "open"`` and write everything (idempotent)."""
    if _writer_pid != os.getpid():
        return
    try:
        fold()
        with _fold_lock:
            if _open:
                _close(list(_open), "open", snapshot())
        flush()
    except Exception as e:  # noqa: BLE001
        _core.report_error("bindings", f"exit: {type(e).__name__}: {e}")


def _after_fork() -> None:
    """A forked child has none of its parent's requests (nor its writer thread, nor, should
    that thread have held them at the fork, free locks)."""
    global _flush_lock, _fold_lock, _fd
    _flush_lock = threading.Lock()
    _fold_lock = threading.Lock()
    if _fd >= 0:  # the parent's file: not the child's to hold (it opens its own)
        try:
            os.close(_fd)
        except OSError:
            pass
        _fd = -1
    reset()


def reset() -> None:
    """Forget every request and step logged (a forked child; tests)."""
    global _epoch, _epoch_last, _steady, _epoch_tok
    _log.clear()
    _specshare.uniform_specs.clear()
    _epoch_tok = 0
    _open.clear()
    _irregular.clear()
    _epoch, _epoch_last, _steady = 0, (0, 0, 0), False
    _spec_log.clear()
    _spec_open.clear()
    _hooks[:] = [(), ()]
    _getter[:] = [None, None]
    _last_snap[0] = None
    _buf.clear()


_core.on_fork(_after_fork)
