"""Admission by method class, decided when a call arrives, before it takes a worker.

gRPC's own ``maximum_concurrent_rpcs`` counts every call together: a fleet of agents keeping
it full made ``verifier status`` and gates refused (RESOURCE_EXHAUSTED) although their reads
have threads of their own. Here each class of methods has its own bound and its own threads:

- **agents** (``Hello``, ``Report``): at most ``limit`` in flight (running or queued for one of
  the agents' workers);
- **reads** (``GetRunStatus``, ``ListRuns``, ``ListTargets``): their own bound and threads, so
  agents being busy never refuses nor queues a status call;
- everything else (operators' calls, windows, audits): gRPC's default pool, bounded only by
  gRPC's limit, which ``grpc_limit`` puts above the classes' bounds so that it never decides
  for them.

The decision is made in the server interceptor, which gRPC runs on its polling thread when the
call arrives (before its request is read). A call over its class's bound is answered
RESOURCE_EXHAUSTED by a handler that runs on a thread of its own (never queued behind the
calls that filled the class), and counted (``metrics.note_refusal("busy")`` and the
observer's refusals by method). An admitted call's slot is taken when gRPC submits it to its
class's pool and given back when that task ends, whatever happened to the call (a call
cancelled before its request arrived never reaches the method, but its task still ends).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc

from servewitness.server.metrics import method_name, note_refusal

AGENT_METHODS = ("Hello", "Report")
READ_METHODS = ("GetRunStatus", "ListRuns", "ListTargets")
READ_WORKERS = 2
READ_LIMIT = 32  # status reads in flight (their 2 threads plus those queued for them)
OTHER_LIMIT = 64  # room gRPC keeps for every other method


def grpc_limit(agent_limit: int | None) -> int | None:
    """gRPC's own ``maximum_concurrent_rpcs``: above the agents' and the reads' bounds together,
    plus room for the other methods, so that it never refuses an agent or a read (None: none)."""
    return None if agent_limit is None else agent_limit + READ_LIMIT + OTHER_LIMIT


READS_FIRST_S = 0.05
"""The longest a status read holds back the agents' calls that reach a worker after it began."""
READS_FIRST_SHARE = 0.25
"""The most of the time reads may hold agents back: a read begun less than ``READS_FIRST_S /
READS_FIRST_SHARE`` after the last hold began holds nothing (a client calling status in a loop
slows agents by a quarter at most)."""


class ReadsFirst:
    """Status reads before agents' reports, within one process. Its threads share one
    interpreter lock, handed round among the threads that want it: a status call that needs
    20 ms of it waited behind eight agents' workers for ten times that once the agents kept
    the process busy (BENCHMARKS.md, "Status reads first"). So while a read runs, an agent's
    call that reaches a worker waits before it starts, up to ``grant_s`` after the read began
    (calls already running go on: they are short), and not more than ``share`` of the time;
    so do the process's own passes over every target (the history keeper's, the follower's).
    An agent's call is delayed, never refused: its report is acknowledged as before. A read
    counts once its caller was authorized and its request parsed (``ingress.add_services``):
    a caller refused holds nobody back."""

    def __init__(
        self,
        grant_s: float = READS_FIRST_S,
        share: float = READS_FIRST_SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grant_s = grant_s
        self.cooldown_s = grant_s / share
        self._clock = clock
        self._cond = threading.Condition()
        self._reading = 0
        self._until = 0.0  # agents' calls starting wait until then while a read runs
        self._next = 0.0  # the earliest a read can hold agents back again
        self.holds = 0  # reads that held the others back
        self.waits: collections.Counter[str] = collections.Counter()  # turns that waited, by who
        self.waiting: collections.Counter[str] = collections.Counter()  # waiting now, by who

    @property
    def reads(self) -> int:
        """Status reads running now."""
        return self._reading

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around a status read: agents' calls wait while it runs (if it may hold them)."""
        with self._cond:
            self._reading += 1
            now = self._clock()
            if now >= self._next:
                self._until, self._next = now + self.grant_s, now + self.cooldown_s
                self.holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._reading -= 1
                if not self._reading:
                    self._until = 0.0
                    self._cond.notify_all()

    @contextlib.contextmanager
    def turn(self, who: str = "agents") -> Iterator[None]:
        """Before work that is not a status read (WHO: an agent's call, a pass of the history
        keeper or of the follower): wait while a read holds it back."""
        with self._cond:
            waited = False
            while self._reading and (left := self._until - self._clock()) > 0:
                waited = True
                self.waiting[who] += 1
                self._cond.wait(left)
                self.waiting[who] -= 1
            self.waits[who] += waited
        yield


class ClassPool(futures.ThreadPoolExecutor):
    """The threads of one class of methods, counting its calls in flight: a slot is taken when
    gRPC submits a call and given back when its task ends. GATE, when given, is entered around
    each call's task (``ReadsFirst.turn``)."""

    def __init__(
        self,
        name: str,
        workers: int,
        limit: int | None,
        gate: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        super().__init__(workers, thread_name_prefix=name)
        self.name = name
        self.limit = limit
        self._gate = gate
        self._count_lock = threading.Lock()
        self.in_flight = 0

    def full(self) -> bool:
        return self.limit is not None and self.in_flight >= self.limit

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        with self._count_lock:
            self.in_flight += 1

        def counted() -> Any:
            try:
                if self._gate is None:
                    return fn(*args, **kwargs)
                with self._gate():
                    return fn(*args, **kwargs)
            finally:
                with self._count_lock:
                    self.in_flight -= 1

        try:
            return super().submit(counted)
        except BaseException:  # shut down: the task will never run, give its slot back
            with self._count_lock:
                self.in_flight -= 1
            raise


def _busy(pool: ClassPool, method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    """The refusal, served as a client-streaming handler: it never reads the request. (A unary
    handler is called only once gRPC has read the request, on the pool thread: a call that
    sends its headers and never its request would hold the refusals' thread, and every later
    refusal would wait behind it, turning "busy" into clients' timeouts.)"""
    detail = (
        f"busy: {pool.limit} {pool.name} calls in flight (the verifier's bound for "
        f"{method}); back off and try again"
    )

    def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
        note_refusal("busy")
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, detail)

    return refuse


def _served(
    inner: Callable[[Any, grpc.ServicerContext], Any],
) -> Callable[[Any, grpc.ServicerContext], Any]:
    def serve(request: Any, context: grpc.ServicerContext) -> Any:
        return inner(request, context)

    return serve


class Admission(grpc.ServerInterceptor):
    """Each method of a class served by its class's pool, or refused at once when the class is
    at its bound (see the module's docstring). Put it after ``RpcObserver`` in the server's
    interceptors, so that the observer counts its refusals."""

    def __init__(
        self,
        classes: Iterable[tuple[tuple[str, ...], ClassPool]],
        on_busy: Callable[[str], None] | None = None,
    ) -> None:
        self.on_busy = on_busy  # told the method of each call refused (server/pacing.py)
        self.pools: dict[str, ClassPool] = {}
        for methods, pool in classes:
            for m in methods:
                self.pools[m] = pool
        # refusals have a thread of their own: never queued behind the calls that filled a class
        self.refusals = futures.ThreadPoolExecutor(1, thread_name_prefix="refuse")
        # the handlers given for each (method, inner handler), built once (a call is decided
        # on gRPC's polling thread: building them per call cost it a closure and a handler)
        self._made: dict[tuple[str, bool], tuple[grpc.RpcMethodHandler[Any, Any], Any]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = method_name(handler_call_details.method)
        pool = self.pools.get(method) if method is not None else None
        if handler is None or handler.unary_unary is None or pool is None or method is None:
            return handler
        busy = pool.full()
        if busy and self.on_busy is not None:
            self.on_busy(method)
        made = self._made.get((method, busy))
        if made is not None and made[0] is handler:
            return made[1]  # type: ignore[no-any-return]
        if busy:
            refuse = _busy(pool, method)
            refuse.experimental_thread_pool = self.refusals  # type: ignore[attr-defined]
            out = grpc.stream_unary_rpc_method_handler(
                refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        else:
            behavior = _served(handler.unary_unary)
            behavior.experimental_thread_pool = pool  # type: ignore[attr-defined]
            out = grpc.unary_unary_rpc_method_handler(
                behavior,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._made[(method, busy)] = (handler, out)
        return out

    def shutdown(self) -> None:
        self.refusals.shutdown(wait=False)
        for pool in set(self.pools.values()):
            pool.shutdown(wait=False)
