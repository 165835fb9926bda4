"""Errors raised by the broker layer; nats-py errors are translated here, by JetStream
error code, so the rest of Agent-Reach never sees a nats-py exception.

    BrokerError                    root of everything this package raises (a ReachError)
    ├── ConnectError               no server reachable at the URL
    │   ├── TlsFailed                  the TLS handshake failed (an untrusted certificate)
    │   └── AuthenticationFailed       the server refused the credentials
    │       └── UnusableCredentials    the credentials cannot be used as they are
    ├── BrokerTimeout              a request to the server did not answer in time
    ├── NoResponders               nobody listens on a request's subject
    ├── NoStreamError              no stream answered a publish (restarting, or not provisioned)
    ├── JetStreamError             the server refused an API call (carries err_code)
    │   ├── StreamNotFound
    │   ├── ConsumerNotFound
    │   ├── WrongLastSequence      optimistic concurrency on a KV key or stream lost
    │   ├── SubjectFull            per-subject limit reached with discard-new
    │   │   └── StreamFull         the whole stream's byte or message limit
    │   ├── ValueTooLarge          a message over its stream's (a bucket's) max_msg_size
    │   └── Unavailable            JetStream did not serve the request (503): a stream or
    │                              consumer gone, or a leader being elected
    ├── TooLarge                   a message is over the server's max payload
    ├── ProvisionError             a stream or bucket cannot be brought to its spec
    └── EmbeddedServerError        the embedded nats-server could not start
"""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors

from agentreach.errors import ReachError

# JetStream API error codes (nats-server server/errors.json).
STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
STREAM_NAME_IN_USE = 10058
WRONG_LAST_SEQUENCE = 10071
WRONG_LAST_SEQUENCE_REPLICATED = 10164  # the same refusal, from a replicated (R>1) stream
SUBJECT_FULL = 10077
MESSAGE_TOO_LARGE = 10054  # over the stream's max_msg_size (a bucket's value limit)


class BrokerError(ReachError):
    """Root of the broker package's exceptions."""


class ConnectError(BrokerError):
    """No NATS server could be reached."""


class TlsFailed(ConnectError):
    """The TLS handshake with the server failed (its certificate is not trusted, or it
    wants a client certificate): waiting will not help."""


class AuthenticationFailed(ConnectError):
    """The server refused the credentials (or their absence), or they cannot be used at all
    (:class:`UnusableCredentials`): waiting will not help."""


class UnusableCredentials(AuthenticationFailed):
    """The credentials given cannot be used as they are (a file that is missing, unreadable
    or of the wrong kind): no server is asked, and waiting will not help."""


class BrokerTimeout(BrokerError):
    """The server did not answer in time."""


class NoResponders(BrokerError):
    """A request found nobody subscribed to its subject (the server said so at once)."""


class NoStreamError(BrokerError):
    """A JetStream publish found no stream for its subject."""


class JetStreamError(BrokerError):
    """The JetStream API refused a request."""

    def __init__(self, description: str, *, err_code: int | None = None) -> None:
        super().__init__(f"{description} (err_code={err_code})" if err_code else description)
        self.description = description
        self.err_code = err_code


class StreamNotFound(JetStreamError):
    """The stream does not exist."""


class ConsumerNotFound(JetStreamError):
    """The consumer does not exist."""


class WrongLastSequence(JetStreamError):
    """A conditional write lost the race: someone wrote first."""


class Contended(WrongLastSequence):
    """A compare-and-set lost the race every time it tried."""


class SubjectFull(JetStreamError):
    """The subject holds as many messages as its limit allows."""


class StreamFull(SubjectFull):
    """The whole stream holds as many bytes (or messages) as its limit allows, refusing new
    writes (discard new): none of its subjects takes more until some go. (err_code 10077, as
    a full subject's: the server's description tells them apart.)"""


class ValueTooLarge(JetStreamError):
    """A message is larger than its stream (a bucket, for a value) keeps: trying again
    cannot help."""


class Unavailable(JetStreamError):
    """JetStream answered 503: nothing serves this stream or consumer right now."""


class ConnectionBroke(BrokerError):
    """Not sent: the connection broke after the decision the write carries was made (its
    reads may be stale; the caller decides again)."""


class TooLarge(BrokerError):
    """A message is larger than the server's max payload."""


class ProvisionError(BrokerError):
    """A stream or bucket could not be created or updated to its spec."""


class EmbeddedServerError(BrokerError):
    """The embedded nats-server could not be started."""


_BY_CODE: dict[int, type[JetStreamError]] = {
    STREAM_NOT_FOUND: StreamNotFound,
    CONSUMER_NOT_FOUND: ConsumerNotFound,
    WRONG_LAST_SEQUENCE: WrongLastSequence,
    WRONG_LAST_SEQUENCE_REPLICATED: WrongLastSequence,
    SUBJECT_FULL: SubjectFull,
    MESSAGE_TOO_LARGE: ValueTooLarge,
}


def translate(exc: BaseException, *, subject: str | None = None) -> BrokerError:
    """The broker exception for a nats-py exception."""
    if isinstance(exc, BrokerError):
        return exc
    if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError):
        return WrongLastSequence(
            str(exc.description or "wrong last sequence"), err_code=WRONG_LAST_SEQUENCE
        )
    if isinstance(exc, nats.js.errors.APIError):
        code = exc.err_code
        if code not in _BY_CODE and isinstance(exc, nats.js.errors.ServiceUnavailableError):
            where = f" for {subject!r}" if subject else ""
            return Unavailable(f"JetStream unavailable{where} (503)", err_code=code)
        cls = _BY_CODE.get(code or 0, JetStreamError)
        description = exc.description or type(exc).__name__
        if cls is StreamNotFound:  # the server is new, or was wiped: say what to do
            where = f" ({subject})" if subject else ""
            description += f"{where}: run `reach provision` (or start the coordinator)"
        if cls is SubjectFull and "per subject" not in description:
            cls = StreamFull  # "maximum bytes exceeded", "maximum messages exceeded"
            description += f": the stream of {subject!r} is full" if subject else ": stream full"
        return cls(description, err_code=code)
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        where = f" on {subject!r}" if subject else ""
        return NoStreamError(
            f"no stream answered{where}: the server is restarting, or the streams are not"
            " provisioned (`reach provision`)"
        )
    if isinstance(exc, nats.js.errors.InvalidKeyError):
        where = f" {subject!r}" if subject else ""
        return BrokerError(
            f"invalid key{where}: keys are letters, digits, '-', '_', '=', '.' and '/'"
        )
    if isinstance(exc, nats.errors.NoRespondersError):
        return NoResponders(f"nobody answers{f' on {subject!r}' if subject else ''}")
    if isinstance(exc, nats.errors.MaxPayloadError):
        return TooLarge(f"message too large for the server{f' on {subject!r}' if subject else ''}")
    if isinstance(exc, nats.errors.TimeoutError | TimeoutError):
        return BrokerTimeout(f"timed out{f' on {subject!r}' if subject else ''}")
    if isinstance(exc, nats.errors.NoServersError | ConnectionRefusedError | OSError):
        return ConnectError(str(exc) or type(exc).__name__)
    return BrokerError(f"{type(exc).__name__}: {exc}")


def honour_cancellation() -> None:
    """Raise CancelledError if this task was asked to stop.

    nats-py swallows CancelledError in places (a flush, a publish waiting for
    room), so a loop around nats calls checks this each turn or it may never end.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def pause(seconds: float) -> None:
    """A loop's wait between its rounds: first :func:`honour_cancellation`, then sleep.

    A cancel that nats-py swallowed during the round (Python 3.11's ``wait_for`` returns an
    answer that came in the same turn as the cancel) is consumed: a plain sleep after it
    would not raise, and the loop would run on (a coordinator took 5 s to stop, a sleep's
    length; a loop without a check, for good)."""
    honour_cancellation()
    await asyncio.sleep(seconds)


class translated:  # lower case: it reads as what it does, `with translated(subject=s):`
    """Re-raise nats-py errors inside the block as broker errors.

    A class, not a ``@contextmanager`` generator: it wraps every publish, ack and read,
    and costs a third of a generator's time per block."""

    __slots__ = ("_subject",)

    def __init__(self, *, subject: str | None = None) -> None:
        self._subject = subject

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, nats.errors.Error | TimeoutError | OSError):
            raise translate(exc, subject=self._subject) from exc
