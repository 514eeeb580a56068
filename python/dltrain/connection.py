"""One control session with the leader: JSON over WebSocket (docs/protocol.md, "Control
plane"), through Debian's python3-websocket (websocket-client).

A `Session` sends requests and waits for their replies; events that arrive meanwhile are
kept, in order, for `next_event`. It is not thread-safe: one thread uses a session at a
time (the `Client` holds a lock around it).
"""
import collections
import itertools
import json
import socket
import ssl
import time

from .errors import ConfigError, NoLeader, Unauthorized, from_reply

PROTOCOL_VERSION = 1
# How long a session may hear nothing before it sends a ping, and how long after the ping
# it waits for anything (the pong included) before it takes the leader for gone: the
# CLI's WebSocket keep-alive does the same.
KEEPALIVE_SECONDS = 15.0
# The leader closes a client session it has heard nothing from for 30 s
# (wire::kControlIdleTimeout); a session idle for longer than this is not used for a
# request but replaced (Session.idle_seconds, Client._call).
IDLE_REUSE_SECONDS = 10.0


class ReplyTimeout(NoLeader):
    """No reply within the request's timeout on a connection that is still open (the
    request may yet be acted on: it is not sent again)."""


def tls_context(ca_file):
    """The TLS context wss:// sessions verify the leader with: `ca_file`'s certificates
    (PEM), or the system's trust store when None. Raises ConfigError (field "ca_file")
    when the file cannot be read or holds no certificate."""
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError("cannot use CA file %r: %s" % (ca_file, e), field="ca_file") from None
    return ctx


def _websocket():
    try:
        import websocket  # Debian's python3-websocket, PyPI's websocket-client
    except ImportError:
        raise NoLeader("the dltrain client needs websocket-client: apt install python3-websocket "
                       "(or pip install websocket-client)") from None
    return websocket


class Session:
    """A connected control session. `url` is ws://HOST:PORT or wss://HOST:PORT; the session
    speaks to its /v1/client endpoint with `token` as the bearer token. `timeout` (s)
    bounds the connection and the TLS and WebSocket handshakes; `ca_file` (wss:// only)
    names the CA certificates to verify the leader with (None: the system's).

    Raises Unauthorized when the leader refuses the token (HTTP 401), NoLeader for
    anything else that stops the connection (refused, unreachable, timed out, TLS)."""

    def __init__(self, url, token, timeout, tls=None):
        ws = _websocket()
        self.url = url
        # The context is made by the caller (tls_context), so that a bad CA file is a
        # ConfigError there, and websocket-client's own CA settings do not apply.
        sslopt = {"context": tls or tls_context(None)} if url.startswith("wss://") else None
        self._ws = ws.WebSocket(sslopt=sslopt)
        try:
            try:
                # As the CLI, straight to the leader: an http(s)_proxy in the environment
                # is not used (http_no_proxy "*" turns websocket-client's use of it off).
                self._ws.connect(url.rstrip("/") + "/v1/client", timeout=timeout,
                                 header=["Authorization: Bearer " + token], http_proxy_host="unused",
                                 http_no_proxy=["*"])
            except BaseException:
                self._ws.shutdown()  # nothing of a failed connection stays open
                raise
        except ws.WebSocketBadStatusException as e:
            if getattr(e, "status_code", None) == 401:
                raise Unauthorized("the leader at %s refused the client token" % url, code="unauthorized") from None
            raise NoLeader("leader at %s: %s" % (url, e)) from None
        except (OSError, ws.WebSocketException, ssl.SSLError) as e:
            raise NoLeader("leader at %s: %s" % (url, _describe(e))) from None
        try:
            self._ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._ids = itertools.count(1)
        self._events = collections.deque()
        self._heard = time.monotonic()
        self._pinged = None

    def close(self):
        """Closes the session (a close frame when it is still open, then the socket)."""
        try:
            self._ws.close(timeout=1)
        except Exception:  # noqa: BLE001 (closing a broken session: nothing to report)
            pass
        self._ws.shutdown()

    def idle_seconds(self):
        """Seconds since the leader was last heard on this session."""
        return time.monotonic() - self._heard

    def request(self, type_, body, timeout):
        """Sends request `type_` with `body` (a dict) and returns the reply's body. Raises
        the error reply's exception (errors.from_reply), NoLeader when no reply comes within
        `timeout` s or the connection is lost."""
        rid = "p%d" % next(self._ids)
        self._send({"v": PROTOCOL_VERSION, "id": rid, "type": type_, "body": body})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplyTimeout("the leader at %s did not answer %s within %g s" % (self.url, type_, timeout))
            msg = self._receive(left)
            if msg is None:
                continue
            if msg.get("type") == "event":
                self._events.append(msg.get("body", {}))
                continue
            if msg.get("type") == "reply" and msg.get("id") == rid:
                if msg.get("ok"):
                    return msg.get("body", {})
                raise from_reply(msg.get("error") or {})
            # a reply to another request (one that timed out before): not ours

    def next_event(self, timeout):
        """The next event's body (a dict), waiting up to `timeout` s; None when none came.
        Raises NoLeader when the connection is lost or the leader went silent (no answer to
        a keep-alive ping)."""
        if self._events:
            return self._events.popleft()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            msg = self._receive(left)
            if msg is not None and msg.get("type") == "event":
                return msg.get("body", {})

    def _send(self, msg):
        ws = _websocket()
        try:
            self._ws.send(json.dumps(msg))
        except (OSError, ws.WebSocketException) as e:
            raise NoLeader("lost the connection to the leader at %s: %s" % (self.url, _describe(e))) from None

    def _receive(self, timeout):
        """One text message as a dict, or None after `timeout` s (or a control frame)."""
        ws = _websocket()
        now = time.monotonic()
        if self._pinged is None and now - self._heard > KEEPALIVE_SECONDS:
            try:
                self._ws.ping()
            except (OSError, ws.WebSocketException) as e:
                raise NoLeader("lost the connection to the leader at %s: %s" % (self.url, _describe(e))) from None
            self._pinged = now
        if self._pinged is not None and now - self._pinged > KEEPALIVE_SECONDS:
            raise NoLeader("the leader at %s went silent (no answer to a ping within %g s)" % (self.url, KEEPALIVE_SECONDS))
        self._ws.settimeout(max(0.01, min(timeout, KEEPALIVE_SECONDS / 3)))
        try:
            opcode, data = self._ws.recv_data(control_frame=True)
        except ws.WebSocketTimeoutException:
            return None
        except socket.timeout:
            return None
        except (OSError, ws.WebSocketException) as e:
            raise NoLeader("lost the connection to the leader at %s: %s" % (self.url, _describe(e))) from None
        self._heard, self._pinged = time.monotonic(), None
        if opcode == ws.ABNF.OPCODE_CLOSE:
            raise NoLeader("the leader at %s closed the session" % self.url)
        if opcode != ws.ABNF.OPCODE_TEXT:
            return None
        try:
            return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
        except ValueError:
            raise NoLeader("the leader at %s sent a message that is not JSON" % self.url) from None


def _describe(e):
    return str(e) or type(e).__name__


def connect_first(urls, token, total, tls=None, say=None, rounds_for_one=False):
    """A Session with the first of `urls` that answers (with HA only the serving candidate
    does): each tried in turn for up to min(total, 5) s when there are several, round
    after round 0.5 s apart for up to `total` s; a single URL is tried once within
    `total`, unless `rounds_for_one` (a leader that restarts). `tls`: tls_context()'s, for
    wss:// URLs. `say` (may be None) is told about failed rounds. Returns (session, index
    of its URL). Raises Unauthorized at once, NoLeader naming each URL and why after
    `total`."""
    several = len(urls) > 1 or rounds_for_one
    per_try = min(total, 5.0) if several else total
    deadline = time.monotonic() + total
    why = {}
    rounds = 0
    while True:
        for i, url in enumerate(urls):
            left = deadline - time.monotonic()
            try:
                return Session(url, token, max(0.1, min(per_try, left)), tls), i
            except NoLeader as e:
                why[url] = e.message
        rounds += 1
        if not several or time.monotonic() + 0.5 >= deadline:
            raise NoLeader("no leader answered within %g s: %s" % (total, "; ".join("%s" % w for w in why.values())))
        if say is not None and (rounds == 1 or rounds % 10 == 0):
            say("no leader answered yet (%s); trying again" % "; ".join(why.values()))
        time.sleep(0.5)
