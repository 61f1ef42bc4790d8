"""Holding a reservation while a handler runs: renewal, the fencing token, the handler's view.

A reservation is a lease: it expires ``reservation`` seconds after it was last written. A
handler may run longer than that, or its host may stall (a GC pause, SIGSTOP, a slow disk);
if nothing renewed the lease in the meantime, another host would take the entity over and two
handlers would run on it at once, their effects landing out of order. So a worker renews the
reservation in the background while it holds the entity (once a third of it has passed; one
renewal task per host looks at every reservation it holds), and when a renewal finds the
reservation gone (:class:`~.checkpoint.ReservationLost`), or cannot renew it before the local
expiry, it cancels the handler.

Renewal cannot cover a host that is stopped: when it resumes, its handler may run a step before
the renewal task notices. Two things fence it. Every new claim raises the checkpoint's
``fence`` (renewals keep it), and every checkpoint write of the holder names its owner and
fence, so a stale holder's writes are refused. And the handler sees a :class:`HandlerContext`:
``held()`` is False once the local expiry has passed or the loss is known, and ``fence`` is a
token to pass to the handler's own writes elsewhere, which should refuse a token lower than one
they have already seen (docs/checkpoints.md, "Handlers with outside effects").
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import attrs
import trio

from headrace.checkpoints.checkpoint import Checkpoint, CheckpointId, ReservationLost
from headrace.checkpoints.store import CheckpointStore


@attrs.define(slots=True, eq=False)
class HandlerContext:
    """What a handler may know about the reservation it runs under; passed as the second
    argument to handlers that take two.

    ``checkpoint`` and ``seq`` (the stream sequence of the message being handled) key an
    idempotent effect; ``fence`` is the reservation's fencing token: higher for every new claim
    of the checkpoint, so a store that keeps the highest token it has seen can refuse a stale
    holder's write.
    """

    checkpoint: CheckpointId
    fence: int
    #: When the reservation expires, as of its last write by this worker (seconds since the
    #: epoch, by ``clock``).
    expires_at: float
    clock: Callable[[], float] = attrs.field(repr=False)
    #: The stream sequence of the message being handled (0 between messages).
    seq: int = 0
    #: Why the reservation was lost, once the worker knows it is.
    lost: str | None = None

    def held(self) -> bool:
        """Whether this worker still holds the checkpoint, as far as it knows without asking
        the server: not known lost and not past its expiry. True is not a promise (the host
        may stall right after); the fencing token is."""
        return self.lost is None and self.clock() < self.expires_at

    def ensure_held(self) -> None:
        """Raise :class:`~.checkpoint.ReservationLost` unless :meth:`held`: a handler calls it
        before an effect it cannot fence. The worker then stops and writes nothing."""
        if not self.held():
            why = self.lost or f"its reservation expired at {self.expires_at:.3f}"
            raise ReservationLost(f"checkpoint {self.checkpoint} (fence {self.fence}): {why}")


def takes_context(handler: Callable[..., object]) -> bool:
    """Whether ``handler`` takes a second positional argument (the :class:`HandlerContext`);
    one-argument handlers are called as before."""
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):  # a builtin or an odd callable: the old way
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in parameters) >= 2


async def renew_once(
    store: CheckpointStore,
    ctx: HandlerContext,
    renew: Callable[[Checkpoint], Checkpoint],
    on_lost: trio.CancelScope,
    on_error: Callable[[Exception], None],
) -> None:
    """Renew ``ctx``'s reservation once. ``renew`` raises :class:`ReservationLost` when the
    stored reservation is not ours any more; then, or when the renewal did not get through
    before the local expiry (the server unreachable: another host may take over once it is
    back), ``ctx.lost`` says why and ``on_lost`` is cancelled. Any other failure is said
    (``on_error``) and left for the next renewal."""
    # A renewal that cannot get through before the expiry is too late anyway.
    with trio.move_on_at(_trio_deadline(ctx.expires_at, ctx.clock())):
        try:
            stored = await store.change(ctx.checkpoint, renew)
        except ReservationLost as exc:
            lose(ctx, on_lost, str(exc))
            return
        except Exception as exc:  # a KV hiccup: said, and tried again next round
            on_error(exc)
        else:
            if stored.checkpoint.reservation is not None:
                ctx.expires_at = stored.checkpoint.reservation.expires_at
                on_lost.deadline = expiry_deadline(ctx)
    if not ctx.held():
        lose(ctx, on_lost, f"not renewed before it expired at {ctx.expires_at:.3f}")


def lose(ctx: HandlerContext, processing: trio.CancelScope, why: str) -> None:
    """The reservation is lost: the handler learns why, and its processing is cancelled."""
    ctx.lost = ctx.lost or why
    processing.cancel()


def expiry_deadline(ctx: HandlerContext) -> float:
    """When ``ctx``'s reservation expires, as a trio deadline (for the processing's scope)."""
    return _trio_deadline(ctx.expires_at, ctx.clock())


def _trio_deadline(expires_at: float, now: float) -> float:
    """``expires_at`` (by the worker's clock) as a trio deadline."""
    left = expires_at - now
    return trio.current_time() + left if math.isfinite(left) else math.inf
