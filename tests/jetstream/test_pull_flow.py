"""The ADR-37 pull flow (``jetstream/pull_flow.py``) without I/O: no server, no fake server,
no trio. A few exact sequences first, then what every status, heartbeat and retry decides,
then state machines in which a model server answers the flow's requests with messages and
every status a pull can get, the user takes messages, the connection drops and comes back, and
time passes, while the invariants are checked after every step (like the commit state's machine
in tests/commits/test_state.py).

What only a socket shows (the frames reaching the flow, the events and errors the user gets
from its decisions) is in ``test_pull_statuses.py``, against a scripted server.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from headrace.errors import NoRespondersError
from headrace.jetstream.errors import (
    ConsumerDeleted,
    ConsumerIsPushBased,
    MessageTooLarge,
    PullStatusError,
)
from headrace.jetstream.pull_flow import (
    HEARTBEAT_ALARM_FACTOR,
    NO_RESPONDERS_RETRY,
    WARNING_RETRY,
    Alarm,
    CheckConsumer,
    Ended,
    Pull,
    PullFlow,
    Warn,
    default_heartbeat,
)
from headrace.jetstream.pull_request import BYTES_MODE_BATCH, PullRequest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

SUBJECT = "$JS.API.CONSUMER.MSG.NEXT.S.C"


def consume_flow(**kw: Any) -> PullFlow:
    options: dict[str, Any] = {
        "batch": 10,
        "threshold": 5,
        "expires": 30.0,
        "heartbeat": 1.0,
        "refill": True,
        "stream": "S",
        "consumer": "C",
        "subject": SUBJECT,
    }
    return PullFlow(**{**options, **kw})


def fetch_flow(**kw: Any) -> PullFlow:
    return consume_flow(**{"threshold": None, "heartbeat": None, "refill": False, **kw})


# -- exact sequences --------------------------------------------------------------------------


def test_the_defaults_are_written_once():
    from headrace.jetstream.consume import ConsumeOptions

    assert ConsumeOptions().heartbeat_alarm_factor == HEARTBEAT_ALARM_FACTOR == 2.0
    assert ConsumeOptions(expires=30).heartbeat == default_heartbeat(30) == 15.0
    assert default_heartbeat(1) == 0.5 and default_heartbeat(100) == 30.0
    # Never more than half of expires: under 1 s (a short pin, issue 24), half of it.
    assert default_heartbeat(0.5) == 0.25


def test_a_consume_asks_for_what_is_missing_once_at_the_threshold():
    flow = consume_flow()
    assert flow.pull(0.0, True) == PullRequest(batch=10, expires=30.0, idle_heartbeat=1.0)
    assert flow.pull(0.0, True) is None  # 10 pending: above the threshold
    flow.received(10, 0, 0.1)
    flow.taken(4, 0)
    assert flow.pull(0.2, True) is None  # 6 pending
    flow.taken(1, 0)
    request = flow.pull(0.3, True)
    assert request is not None and request.batch == 5
    assert (flow.pending_msgs, flow.buffered_msgs, flow.requests_sent) == (10, 5, 2)


def test_no_request_while_disconnected_or_paused():
    flow = consume_flow()
    assert flow.pull(0.0, False) is None  # the connection says it is down
    flow.pause()
    assert flow.pull(0.0, True) is None
    assert flow.resume(1.0) == Pull()
    assert flow.pull(1.0, True) is not None


def test_a_status_with_pending_counts_frees_exactly_what_its_request_no_longer_owes():
    flow = consume_flow()
    flow.pull(0.0, True)
    flow.received(3, 0, 0.1)
    assert flow.status(408, "Request Timeout", 7, 0, 0.2) == Pull()
    assert flow.pending_msgs == 3
    request = flow.pull(0.2, True)
    assert request is not None and request.batch == 7


def test_bytes_mode_too_large_waits_for_room_then_ends_when_max_bytes_is_refused():
    flow = consume_flow(batch=1, max_bytes=1000, threshold=1000)
    flow.pull(0.0, True)
    flow.received(2, 600, 0.1)
    # The request had 400 left; the next message is larger: the re-pull needs more than 400.
    assert flow.status(409, "Message Size Exceeds MaxBytes", 0, 400, 0.2) == Pull()
    assert flow.min_request == 401
    assert flow.pull(0.2, True) is None  # 400 could be asked for: that would be refused
    flow.taken(1, 300)
    request = flow.pull(0.3, True)
    assert request is not None and request.max_bytes == 700 and request.batch == BYTES_MODE_BATCH
    flow.taken(1, 300)  # all taken: the next request asks for all of max_bytes ...
    decision = flow.status(409, "Message Size Exceeds MaxBytes", 0, 1000, 0.4)
    assert isinstance(decision, Ended) and isinstance(decision.error, MessageTooLarge)
    assert flow.pull(0.5, True) is None  # ... and nothing is asked again


def test_warning_and_503_retry_later_and_the_503_checks_the_consumer_first():
    flow = consume_flow()
    flow.pull(0.0, True)
    assert flow.status(409, "Exceeded MaxWaiting", 0, 0, 1.0) == Warn(409, "Exceeded MaxWaiting")
    assert flow.pull(1.0, True) is None and flow.retry_at == 1.0 + WARNING_RETRY
    assert flow.deadline(1.0) == 1.0 + WARNING_RETRY
    assert flow.timer(1.0 + WARNING_RETRY) == Pull()
    assert flow.pull(1.0 + WARNING_RETRY, True) is not None
    assert flow.status(503, "", 0, 0, 2.0) == Warn(503, "No Responders")
    assert flow.timer(2.0 + NO_RESPONDERS_RETRY) == CheckConsumer()
    assert flow.pull(2.0 + NO_RESPONDERS_RETRY, True) is not None


def test_the_heartbeat_alarm_runs_only_while_the_server_owes_messages():
    flow = consume_flow(heartbeat=1.0)
    flow.pull(0.0, True)
    assert flow.deadline(1.5) == 0.0 + 2.0  # last activity 0, alarm after 2 heartbeats
    assert flow.timer(1.9) is None
    assert flow.timer(2.0) == Alarm(2.0)
    assert flow.pending_msgs == 0  # the request is taken as lost
    flow.pull(2.0, True)
    flow.received(10, 0, 2.5)  # everything asked for is here: the server owes nothing
    assert flow.deadline(100.0) == 101.0  # only the periodic wake-up
    assert flow.timer(100.0) is None


def test_messages_of_a_request_counted_as_gone_are_pending_until_taken():
    """Found by the state machine below: a warning forgets every request, but an older one
    still delivers. Before, taking those messages made the pending count negative, and the
    next request asked for more than the buffer holds (12 of 10 here)."""
    flow = consume_flow()
    flow.pull(0.0, True)  # 10
    flow.received(6, 0, 0.1)
    flow.taken(6, 0)
    assert flow.pull(0.2, True) == PullRequest(batch=6, expires=30.0, idle_heartbeat=1.0)
    assert isinstance(flow.status(409, "Exceeded MaxWaiting", 0, 0, 0.3), Warn)
    assert flow.pending_msgs == 0  # both requests counted as gone; the first has 4 left
    flow.received(2, 0, 0.4)
    assert flow.pending_msgs == 2
    flow.taken(2, 0)
    assert flow.pending_msgs == 0
    request = flow.pull(1.0, True)
    assert request is not None and request.batch == 10


def test_the_first_terminal_status_is_the_end():
    flow = consume_flow()
    flow.pull(0.0, True)
    first = flow.status(409, "Consumer Deleted", 0, 0, 0.1)
    assert isinstance(first, Ended) and isinstance(first.error, ConsumerDeleted)
    assert flow.status(400, "Bad Request", 0, 0, 0.2) is None
    assert flow.fail(RuntimeError("later")).error is first.error
    assert flow.error is first.error


@pytest.mark.parametrize(
    ("code", "description", "gets_messages", "error"),
    [
        (404, "No Messages", False, None),
        (408, "Request Timeout", True, None),
        (409, "Leadership Change", False, None),
        (409, "Exceeded MaxWaiting", False, None),
        (409, "Message Size Exceeds MaxBytes", True, None),
        (409, "Message Size Exceeds MaxBytes", False, MessageTooLarge),
        (409, "Consumer Deleted", False, ConsumerDeleted),
        (409, "Something New", False, PullStatusError),
        (503, "", False, NoRespondersError),
    ],
)
def test_a_fetch_ends_at_its_first_status(code, description, gets_messages, error):
    flow = fetch_flow(batch=1, max_bytes=100)
    assert flow.pull(0.0, True) is not None and flow.pull(0.0, True) is None  # one request
    if gets_messages:
        flow.received(1, 10, 0.1)
    assert flow.status(100, "Idle Heartbeat", 0, 0, 0.2) is None
    decision = flow.status(code, description, 0, 0, 0.3)
    assert isinstance(decision, Ended) and flow.ended
    if error is None:
        assert decision.error is None
    else:
        assert isinstance(decision.error, error)


def test_a_fetch_ends_when_full_or_silent():
    flow = fetch_flow(batch=3, heartbeat=1.0)
    request = flow.pull(5.0, True)
    assert request == PullRequest(batch=3, expires=30.0, idle_heartbeat=1.0)
    assert flow.received(2, 0, 5.5) is None
    assert flow.deadline(6.0) == 7.5
    assert flow.timer(7.4) is None
    assert flow.timer(7.5) == Ended(None)
    full = fetch_flow(batch=3)
    full.pull(0.0, True)
    assert full.deadline(0.0) == math.inf  # no heartbeat: only the driver's time limit
    assert full.received(3, 0, 0.1) == Ended(None)


def test_no_wait_asks_without_expires():
    request = fetch_flow(batch=2, expires=None, no_wait=True).pull(0.0, True)
    assert request == PullRequest(batch=2, no_wait=True)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        consume_flow(batch=0)
    with pytest.raises(ValueError, match="threshold"):
        consume_flow(threshold=11)


# -- what each status decides (ADR-37 "Status handling") ---------------------------------------


@pytest.mark.parametrize(
    ("code", "description"),
    [
        (404, "No Messages"),
        (408, "Request Timeout"),
        (409, "Message Size Exceeds MaxBytes"),  # messages mode: only the request ends
        (408, "Interest Expired"),
        (423, "Nats-Wrong-Pin-Id"),  # no pin held: nothing to forget
        (409, "Batch Completed"),
    ],
)
def test_quiet_statuses_end_the_request_and_pull_what_it_no_longer_owes(code, description):
    """Nothing for the user (the driver tells only of a Warn, an Alarm or an Unpinned) and no
    pause: the request's 6 undelivered (its pending-count header) are asked again at once."""
    flow = consume_flow()  # 10, threshold 5
    flow.pull(0.0, True)
    flow.received(4, 0, 0.1)
    assert flow.status(code, description, 6, 0, 0.2) == Pull()
    assert flow.pending_msgs == 4 and flow.retry_at is None
    request = flow.pull(0.2, True)
    assert request is not None and request.batch == 6
    assert flow.received(1, 0, 0.3) is None  # still consuming
    assert not flow.ended and flow.error is None


@pytest.mark.parametrize(
    "description",
    [
        "Exceeded MaxRequestBatch of 5",
        "Exceeded MaxRequestExpires of 1s",
        "Exceeded MaxRequestMaxBytes of 100",
        "Exceeded MaxWaiting",
        # Servers before 2.10, for a pull whose batch exceeds max_ack_pending (issue 24: it
        # ended the consume as an unknown status).
        "Exceeded MaxAckPending",
        "Server Shutdown",
    ],
)
def test_409_limit_statuses_are_warnings_not_ends(description):
    """A refused request will not bring its messages: the flow stops counting them and asks
    again a quarter second later, once: not at once (the server would refuse it the same
    way), not in a loop. Not terminal: what comes meanwhile is delivered."""
    flow = consume_flow()
    flow.pull(0.0, True)
    assert flow.status(409, description, 0, 0, 1.0) == Warn(409, description)
    assert not flow.ended and flow.error is None
    assert flow.pending_msgs == 0  # the refused 10 are no longer counted as owed
    assert flow.pull(1.1, True) is None
    assert flow.deadline(1.1) == 1.0 + WARNING_RETRY
    assert flow.timer(1.0 + WARNING_RETRY) == Pull()
    request = flow.pull(1.0 + WARNING_RETRY, True)
    assert request is not None and request.batch == 10
    assert flow.pull(1.0 + WARNING_RETRY, True) is None  # one retry, not a loop
    assert flow.received(2, 0, 1.5) is None and not flow.ended


@pytest.mark.parametrize(
    ("code", "description", "error"),
    [
        (400, "Bad Request", PullStatusError),
        (418, "I'm a teapot", PullStatusError),
        # ADR-15 "Unknown Error Statuses", as docs/jetstream.md says: a 409 the client does
        # not know is an error too (it was only a warning, and the consume went on).
        (409, "Something New", PullStatusError),
        (409, "Consumer Deleted", ConsumerDeleted),
        (409, "Consumer is push based", ConsumerIsPushBased),
    ],
)
def test_terminal_statuses_end_the_consume_with_their_own_error(code, description, error):
    """The error is exactly the status's class, with its code and description; the buffered
    messages are still there to hand out before it, and nothing is asked again."""
    flow = consume_flow()
    flow.pull(0.0, True)
    flow.received(2, 0, 0.1)
    decision = flow.status(code, description, 0, 0, 0.2)
    assert isinstance(decision, Ended) and type(decision.error) is error
    assert isinstance(decision.error, PullStatusError)
    assert (decision.error.status, decision.error.description) == (code, description)
    assert flow.buffered_msgs == 2
    flow.taken(2, 0)
    assert flow.pull(0.3, True) is None and flow.timer(5.0) is None  # no retry


def test_leadership_change_resets_pending_and_pulls_at_once():
    """409 Leadership Change: the old leader's waiting requests are gone. The flow counts only
    what it holds and asks again at once, not after a heartbeat alarm."""
    flow = consume_flow()
    flow.pull(0.0, True)
    flow.received(3, 0, 0.1)
    assert flow.status(409, "Leadership Change", 0, 0, 0.2) == Pull()
    assert flow.pending_msgs == 3 and flow.retry_at is None
    request = flow.pull(0.2, True)
    assert request is not None and request.batch == 7  # the rest of the buffer


def test_503_is_a_warning_and_the_whole_buffer_is_asked_again_a_second_later():
    flow = consume_flow()
    flow.pull(0.0, True)
    assert flow.status(503, "", 0, 0, 1.0) == Warn(503, "No Responders")
    assert flow.pending_msgs == 0 and flow.pull(1.5, True) is None
    assert flow.deadline(1.5) == 1.0 + NO_RESPONDERS_RETRY
    assert flow.timer(1.0 + NO_RESPONDERS_RETRY) == CheckConsumer()
    request = flow.pull(1.0 + NO_RESPONDERS_RETRY, True)
    assert request is not None and request.batch == 10  # nothing was delivered
    assert flow.pull(2.1, True) is None and flow.timer(2.5) is None  # one retry, not a loop


def test_a_past_retry_time_while_disconnected_does_not_spin():
    """A 503 sets a retry a second ahead; the connection drops before it and comes back after.
    The retry comes due once, while disconnected: it sends nothing and leaves no deadline in
    the past (the control loop spun on one, some 18,000 task steps in half a second, before
    da5a392). The reconnect then asks for the whole buffer."""
    flow = consume_flow()
    flow.pull(0.0, True)
    assert isinstance(flow.status(503, "", 0, 0, 0.0), Warn)
    flow.pause()
    assert flow.timer(1.1) == CheckConsumer()
    assert flow.pull(1.1, True) is None  # paused: the check's pull sends nothing
    assert flow.deadline(1.1) == 1.1 + 1.0  # the periodic wake-up only
    assert flow.timer(1.5) is None and flow.deadline(1.5) > 1.5
    assert flow.resume(1.8) == Pull()
    request = flow.pull(1.8, True)
    assert request is not None and request.batch == 10


def test_the_alarm_is_due_at_the_deadline_whatever_the_floats_say():
    """Found by the state machine (the full suite, 2026-11-29): a consume with a 0.5 s heartbeat
    (alarm after 1.0 s) last active at 1.05 has its deadline at 1.05 + 1.0 == 2.05, where
    2.05 - 1.05 is just under 1.0. The timer must find the alarm due when the deadline says
    so, or the driver wakes at the deadline, finds nothing, and wakes again at once."""
    flow = consume_flow(heartbeat=0.5)
    flow.pull(0.0, True)
    flow.last_activity = 1.05
    assert flow.alarm_after > 2.05 - 1.05  # the float case itself
    assert flow.deadline(2.05) == 2.05
    decision = flow.timer(2.05)
    assert isinstance(decision, Alarm)
    assert flow.deadline(2.05) > 2.05


def test_bytes_mode_a_message_too_large_for_the_rest_waits_for_the_reader():
    """409 Message Size Exceeds MaxBytes with 600 of the 1000 bytes left: the next message is
    larger than 600. Asking for those 600 again would be refused at once, in a loop (issue
    11): the next request waits until the reader made room for more, then asks for all."""
    flow = consume_flow(batch=1, max_bytes=1000, threshold=500)  # ConsumeOptions' half
    first = flow.pull(0.0, True)
    assert first is not None and first.max_bytes == 1000
    flow.received(2, 400, 0.1)
    decision = flow.status(409, "Message Size Exceeds MaxBytes", BYTES_MODE_BATCH - 2, 600, 0.2)
    assert decision == Pull()
    assert flow.pending_bytes == 400  # the refused bytes are no longer owed
    assert flow.pull(0.2, True) is None  # not the same refused request again
    assert flow.requests_sent == 1
    flow.taken(2, 400)
    again = flow.pull(0.3, True)
    assert again is not None and again.max_bytes == 1000  # more than was refused
    assert flow.received(1, 700, 0.4) is None and not flow.ended  # it fits now


# -- heartbeats (ADR-37 "Idle heartbeats") --------------------------------------------------------


def test_heartbeats_keep_the_alarm_quiet():
    """idle_heartbeat 0.5 s: the alarm is due after 1 s of silence. The driver reports every
    read, a heartbeat's too, with ``received``: heartbeats every 0.15 s for 1.8 s keep it
    quiet, with no new request."""
    flow = consume_flow(heartbeat=0.5)
    flow.pull(0.0, True)
    now = 0.0
    for _ in range(12):
        assert flow.timer(now + 0.149) is None
        now += 0.15
        assert flow.received(0, 0, now) is None
        assert flow.status(100, "Idle Heartbeat", 0, 0, now) is None
        assert flow.deadline(now) == now + 0.5
    assert flow.timer(now) is None
    assert (flow.requests_sent, flow.pending_msgs, flow.ended) == (1, 10, False)


def test_a_new_request_starts_the_heartbeat_clock():
    """The first request, long after the flow was made: nothing is due before 2 x 0.5 s from
    it, so 0.5 s of silence is no alarm and no second request."""
    flow = consume_flow(heartbeat=0.5)
    assert flow.pull(5.0, True) is not None
    assert flow.timer(5.5) is None
    assert flow.pull(5.5, True) is None and flow.requests_sent == 1
    assert flow.deadline(5.99) == 6.0
    assert flow.timer(6.0) == Alarm(1.0)


def test_a_request_after_a_quiet_full_buffer_starts_the_heartbeat_clock():
    """The buffer was full and the server quiet (rightly: nothing was owed) for longer than
    the alarm. The reader then takes everything, which sends a request: its clock starts
    then, not at the last message received."""
    flow = consume_flow(heartbeat=0.5)
    flow.pull(0.0, True)
    flow.received(10, 0, 0.1)
    assert flow.timer(1.2) is None  # nothing is owed
    flow.taken(10, 0)
    request = flow.pull(1.2, True)
    assert request is not None and request.batch == 10
    assert flow.timer(1.7) is None  # 0.5 s after the request
    assert flow.deadline(1.7) == 1.2 + 1.0
    assert isinstance(flow.timer(2.2), Alarm)


def test_one_new_request_per_heartbeat_alarm():
    """After an alarm the new request gets its own 1 s: a server that stays silent for 0.5 s
    more sees exactly one new request, not a flood."""
    flow = consume_flow(heartbeat=0.5)
    flow.pull(0.0, True)
    flow.received(3, 0, 0.1)
    flow.taken(3, 0)
    assert flow.pull(0.1, True) is None  # 7 pending: above the threshold
    assert isinstance(flow.timer(1.1), Alarm)
    request = flow.pull(1.1, True)
    assert request is not None and request.batch == 10  # the lost request is forgotten
    assert flow.pull(1.1, True) is None
    assert flow.timer(1.6) is None
    assert flow.deadline(1.6) == 1.1 + 1.0
    assert flow.requests_sent == 2


# -- fetch ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "delivered", "error"),
    [
        ([("msgs", 2), (408, "Request Timeout")], 2, None),
        ([(100, "Idle Heartbeat"), ("msgs", 1), (404, "No Messages")], 1, None),
        ([(409, "Message Size Exceeds MaxBytes")], 0, None),  # messages mode: nothing too large
        ([(409, "Exceeded MaxWaiting")], 0, None),
        ([(409, "Something New")], 0, PullStatusError),
        ([("msgs", 1), (409, "Something New")], 1, PullStatusError),
        ([(409, "Consumer Deleted")], 0, ConsumerDeleted),
        ([("msgs", 2), (409, "Consumer Deleted")], 2, ConsumerDeleted),
        ([(409, "Consumer is push based")], 0, ConsumerIsPushBased),
        ([(400, "Bad Request")], 0, PullStatusError),
        ([(503, "")], 0, NoRespondersError),
    ],
)
def test_fetch_status_sequences(script, delivered, error):
    """How each sequence ends a fetch of 5 (every status but a heartbeat ends it). What the
    driver makes of the end (the messages rather than the error, a 503 explained as
    JetStreamUnavailable) is checked over a socket in ``test_pull_statuses.py``."""
    flow = fetch_flow(batch=5, expires=5.0)
    assert flow.pull(0.0, True) == PullRequest(batch=5, expires=5.0)
    decision = None
    now = 0.0
    for step, arg in script:
        assert decision is None, "ended early"
        now += 0.1
        if step == "msgs":
            decision = flow.received(arg, 0, now)
        else:
            decision = flow.status(step, arg, 5, 0, now)
    assert isinstance(decision, Ended) and flow.ended
    assert flow.buffered_msgs == delivered
    if error is None:
        assert decision.error is None
    else:
        assert type(decision.error) is error
    assert flow.pull(now, True) is None


def test_fetch_heartbeats_keep_it_alive_and_silence_ends_it():
    flow = fetch_flow(batch=1, expires=3.0, heartbeat=0.3)
    flow.pull(0.0, True)
    now = 0.0
    for _ in range(8):  # 1.2 s of heartbeats every 0.15 s; the alarm would be after 0.6 s
        now += 0.15
        assert flow.received(0, 0, now) is None and flow.timer(now) is None
    assert flow.received(1, 0, now + 0.1) == Ended(None)  # full
    silent = fetch_flow(batch=1, expires=3.0, heartbeat=0.3)
    silent.pull(0.0, True)
    assert silent.deadline(0.0) == 0.6  # two missed heartbeats, long before the expiry
    assert silent.timer(0.59) is None
    assert silent.timer(0.6) == Ended(None)


# -- the state machines -----------------------------------------------------------------------

#: What a model server may answer, beside messages and 409 Message Size Exceeds MaxBytes.
STATUSES: list[tuple[int, str]] = [
    (100, "Idle Heartbeat"),
    (404, "No Messages"),
    (408, "Request Timeout"),
    (423, "Locked"),
    (409, "Batch Completed"),
    (409, "Leadership Change"),
    (409, "Exceeded MaxWaiting"),
    (409, "Exceeded MaxRequestBatch of 5"),
    (409, "Server Shutdown"),
    (503, ""),
]
#: The statuses that end a consume (with any status a pull does not know, ADR-15).
TERMINAL: list[tuple[int, str]] = [
    (409, "Consumer Deleted"),
    (409, "Consumer is push based"),
    (409, "Some Future Status"),
    (400, "Bad Request"),
    (418, "Teapot"),
]


def _has_run(machine: FlowMachine) -> bool:
    """Whether a consume has made some requests: the ending rules wait for that, or most runs
    would end in their first steps and explore little."""
    return not machine.flow.refill or machine.flow.requests_sent >= 3


@attrs.define
class Open:
    """A request the model server holds: what it may still send."""

    msgs: int
    nbytes: int | None


class FlowMachine(RuleBasedStateMachine):
    """A consume (``refill``) or a fetch against a model server.

    The model server keeps the flow's requests, oldest first, and sends each only what it asked
    for. It may also answer with any status, with or without the pending-count headers, and
    may lose every request at once (as a consumer leader change does).
    """

    def __init__(self) -> None:
        super().__init__()
        self.flow: PullFlow
        self.now = 0.0
        self.connected = True
        self.server: list[Open] = []
        self.buffer: list[int] = []  # sizes of the messages the user has not taken
        self.ended_with: Ended | None = None
        self.requests_after_end = 0
        self.refused_bound = 0  # bytes mode: the last 409 size status's "left", until a message

    @initialize(
        refill=st.booleans(),
        bytes_mode=st.booleans(),
        size=st.integers(1, 12),
        threshold=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
        heartbeat=st.sampled_from([None, 0.5, 1.0]),
    )
    def start(
        self,
        refill: bool,
        bytes_mode: bool,
        size: int,
        threshold: float,
        heartbeat: float | None,
    ) -> None:
        if refill and heartbeat is None:
            heartbeat = 1.0  # a consume always has heartbeats (ConsumeOptions.heartbeat)
        max_bytes = size * 10 if bytes_mode else None
        limit = max_bytes if max_bytes is not None else size
        self.flow = PullFlow(
            batch=size,
            max_bytes=max_bytes,
            threshold=int(limit * threshold) if refill else None,
            expires=30.0,
            heartbeat=heartbeat,
            refill=refill,
            stream="S",
            consumer="C",
            subject=SUBJECT,
        )
        self.pull()

    # -- helpers ------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        flow = self.flow
        return flow.max_bytes if flow.max_bytes is not None else flow.batch

    @property
    def pending(self) -> int:
        flow = self.flow
        return flow.pending_bytes if flow.max_bytes is not None else flow.pending_msgs

    def pull(self) -> None:
        flow = self.flow
        before, sent_before, min_request = self.pending, flow.requests_sent, flow.min_request
        retry_at = flow.retry_at
        request = flow.pull(self.now, self.connected)
        if request is None:
            assert flow.requests_sent == sent_before
            return
        assert not self.ended_with, "a request after the end"
        assert self.connected
        assert retry_at is None or self.now >= retry_at, "a request before the retry time"
        assert flow.refill or sent_before == 0, "a fetch asks once"
        if flow.refill:
            assert before <= flow.threshold, "a re-pull above the threshold"
        if flow.max_bytes is not None:
            assert request.batch == BYTES_MODE_BATCH and request.max_bytes is not None
            assert request.max_bytes == self.limit - before, "not exactly what is missing"
            assert request.max_bytes >= max(min_request, 1)
            assert request.max_bytes > self.refused_bound, "asked again for what was refused"
            self.server.append(Open(BYTES_MODE_BATCH, request.max_bytes))
        else:
            assert request.max_bytes is None
            assert request.batch == self.limit - before, "not exactly what is missing"
            self.server.append(Open(request.batch, None))
        assert self.pending <= self.limit, "more requested than the buffer holds"

    def act(self, decision: object) -> None:
        """Do what a driver does with a decision."""
        if isinstance(decision, Ended):
            if self.ended_with is None:
                self.ended_with = decision
            assert decision.error is self.ended_with.error, "ended twice, differently"
            return
        assert self.ended_with is None or decision is None, "a decision after the end"
        if isinstance(decision, Warn):
            assert self.flow.retry_at is not None and self.flow.retry_at > self.now
        elif isinstance(decision, Pull | Alarm | CheckConsumer):
            self.pull()
        else:
            assert decision is None

    # -- rules --------------------------------------------------------------------------------

    @precondition(lambda self: bool(self.server))
    @rule(count=st.integers(1, 6), data=st.data())
    def deliver(self, count: int, data: st.DataObject) -> None:
        """The oldest request sends some messages (what fits), in one read."""
        request = self.server[0]
        sizes: list[int] = []
        for _ in range(min(count, request.msgs)):
            size = data.draw(st.integers(1, 25)) if request.nbytes is not None else 0
            if request.nbytes is not None:
                if size > request.nbytes:
                    break
                request.nbytes -= size
            request.msgs -= 1
            sizes.append(size)
        if not sizes:
            return
        if request.msgs == 0 or request.nbytes == 0:
            self.server.pop(0)
        self.buffer.extend(sizes)
        self.refused_bound = 0
        self.now += 0.01
        self.act(self.flow.received(len(sizes), sum(sizes), self.now))

    @precondition(lambda self: bool(self.server) and self.flow.max_bytes is not None)
    @rule(size=st.integers(1, 1000), headers=st.booleans())
    def too_large(self, size: int, headers: bool) -> None:
        """The next message does not fit what the oldest request has left: 409."""
        request = self.server[0]
        assert request.nbytes is not None
        if size <= request.nbytes:
            return
        self.server.pop(0)
        left = request.nbytes
        flow = self.flow
        ended = self.ended_with is not None
        # What the flow takes as refused: the header, or all that was outstanding.
        refused = left if headers else flow.pending_bytes - flow.buffered_bytes
        nothing_yet = flow.buffered_msgs == 0
        self.now += 0.01
        decision = flow.status(
            409, "Message Size Exceeds MaxBytes", 0, left if headers else 0, self.now
        )
        too_large = isinstance(decision, Ended) and isinstance(decision.error, MessageTooLarge)
        if ended:
            assert decision is None
        elif flow.refill:
            # Never loops: ends when the whole max_bytes was refused, else asks only for more.
            assert too_large == (refused >= self.limit)
            if not too_large:
                assert decision == Pull()
                self.refused_bound = max(self.refused_bound, refused)
        else:
            assert isinstance(decision, Ended) and too_large == nothing_yet
        self.act(decision)

    @precondition(_has_run)
    @rule(status=st.sampled_from(TERMINAL), headers=st.booleans())
    def terminal_status(self, status: tuple[int, str], headers: bool) -> None:
        self.status(status, headers)

    @rule(status=st.sampled_from(STATUSES), headers=st.booleans())
    def status(self, status: tuple[int, str], headers: bool) -> None:
        """The oldest request (if any) ends with a status; 100 ends nothing."""
        code, description = status
        gone_msgs = gone_bytes = 0
        if code != 100 and self.server:
            request = self.server.pop(0)
            if headers:
                gone_msgs = request.msgs if request.nbytes is None else 0
                gone_bytes = request.nbytes or 0
        if code in (503,) or (code == 409 and description.startswith("Leadership")):
            self.server.clear()  # the requests are gone with the leader (or never arrived)
        ended = self.ended_with is not None
        last = self.flow.last_activity
        self.now += 0.01
        decision = self.flow.status(code, description, gone_msgs, gone_bytes, self.now)
        if ended or code == 100:
            assert decision is None, "a heartbeat or a status after the end decided something"
        if code == 100:
            assert self.flow.last_activity == last  # activity is the driver's received()
        if not ended and status in TERMINAL:
            assert isinstance(decision, Ended) and isinstance(decision.error, PullStatusError)
        if not ended and not self.flow.refill and code != 100:
            assert isinstance(decision, Ended), "a fetch ends at its first status"
        self.act(decision)

    @precondition(lambda self: bool(self.buffer) and self.flow.refill)
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, len(self.buffer)))
        taken, self.buffer = self.buffer[:count], self.buffer[count:]
        self.flow.taken(count, sum(taken))
        self.pull()

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        """The driver wakes at the flow's deadline (or earlier, for another reason)."""
        deadline = self.flow.deadline(self.now)
        self.now += seconds
        self.tick(deadline)
        # The driver sleeps until the deadline, then asks the timer: finding it due again and
        # again at the same moment is a spin (as on a past 503 retry time while disconnected,
        # before da5a392). A retry and an alarm both due take two calls.
        for _ in range(2):
            if self.flow.ended or self.flow.deadline(self.now) > self.now:
                break
            self.tick(self.now)
        assert self.flow.ended or self.flow.deadline(self.now) > self.now, "the timer spins"

    def tick(self, deadline: float) -> None:
        """The timer at ``self.now``: an alarm or a silent fetch's end never before ``deadline``."""
        last = self.flow.last_activity
        owed = self.flow.outstanding() and self.flow.pulling
        decision = self.flow.timer(self.now)
        if isinstance(decision, Alarm) or (isinstance(decision, Ended) and self.ended_with is None):
            assert owed and self.now >= last + self.flow.alarm_after, "an alarm too early"
            assert self.now >= deadline
            if isinstance(decision, Alarm):
                assert decision.silence == self.now - last
                self.server.clear()  # what the alarm takes as lost is lost
        self.act(decision)

    @precondition(lambda self: self.flow.refill)
    @rule()
    def disconnect(self) -> None:
        self.connected = False
        self.flow.pause()
        self.server.clear()  # the requests die with the connection
        self.pull()

    @precondition(lambda self: self.flow.refill and not self.connected)
    @rule()
    def reconnect(self) -> None:
        self.connected = True
        self.now += 0.01
        self.act(self.flow.resume(self.now))

    @precondition(_has_run)
    @rule()
    def user_ends(self) -> None:
        """The driver stops (close or drain) or fails for its own reason (AckRefused, ...)."""
        self.act(self.flow.end())

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def counts_are_never_negative_and_match_the_buffer(self) -> None:
        flow = self.flow
        assert flow.pending_msgs >= 0 and flow.pending_bytes >= 0
        assert flow.buffered_msgs == len(self.buffer)
        if flow.max_bytes is not None:
            assert flow.buffered_bytes == sum(self.buffer)
            assert flow.pending_bytes >= flow.buffered_bytes
        else:
            assert flow.pending_msgs >= flow.buffered_msgs

    @invariant()
    def never_more_pending_than_the_limit(self) -> None:
        assert self.pending <= self.limit

    @invariant()
    def an_end_is_final(self) -> None:
        if self.ended_with is not None:
            assert self.flow.ended and not self.flow.pulling
            assert self.flow.error is self.ended_with.error


TestFlowMachine = FlowMachine.TestCase


def test_stop_after_asks_for_no_more_than_is_left_and_ends_there():
    """nats.go's StopAfter (issue 24): requests never ask beyond the messages left to hand
    out, and the flow ends, quietly, once that many were taken."""
    flow = consume_flow(stop_after=12)
    first = flow.pull(0.0, True)
    assert first is not None and first.batch == 10
    flow.received(10, 0, 0.1)
    flow.taken(6, 0)
    again = flow.pull(0.2, True)
    assert again is not None and again.batch == 2  # 6 taken, 4 pending: 2 left to ask for
    flow.received(2, 0, 0.3)
    flow.taken(6, 0)
    assert (flow.left, flow.ended, flow.error) == (0, True, None)
    assert flow.pull(0.4, True) is None
    with pytest.raises(ValueError, match="stop_after"):
        consume_flow(stop_after=0)
    with pytest.raises(ValueError, match="stop_after"):
        consume_flow(stop_after=5, max_bytes=100)
