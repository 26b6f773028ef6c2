//! One daemon's RML endpoint: a TCP listener, lazily opened authenticated connections to
//! peers, and an event channel to the daemon actor.
//!
//! Connection model: a daemon sends only on connections it opened itself and receives on
//! those it accepted, so a pair that talks both ways holds two TCP connections. There is no
//! dial race and no tie-break, and the frames one daemon sends to a peer keep their order
//! because they all travel on one TCP stream. Every connection is read by both ends (a
//! closed or silent peer is noticed whichever way the data flows) and carries heartbeats both
//! ways when they are on.
//!
//! Delivery: [`Transport::send`] queues (unbounded, never blocks) on the peer's outbound
//! link, opening it on first use. Frames queued before a `PeerLost` or `ConnectFailed` event
//! for that peer may be lost; the next `send` opens a fresh connection. The transport never
//! relays: the daemon actor holds the `Topology` and names the next hop.
//!
//! Invariants: no frame is delivered from a connection before its handshake succeeded; a bad
//! connection (failed handshake, oversized or malformed frame, silence past the read-idle
//! bound) is closed alone and never takes the listener down; `PeerLost` is reported at most
//! once per peer between two successful handshakes with it, and never for a connection the
//! daemon closed itself (`disconnect`, `shutdown`).
//!
//! How a daemon uses it:
//!
//! ```no_run
//! use dvm_rml::{DvmSecret, Route, Topology, Transport, TransportConfig, TransportEvent};
//! # async fn daemon(secret: DvmSecret, topo: Topology, wireup: Vec<(u32, std::net::SocketAddr)>)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = TransportConfig::new(topo.me(), 1, "0.0.0.0:0".parse()?, secret);
//! let (transport, mut events) = Transport::bind(cfg).await?;
//! // Report `transport.local_addr()` in the check-in; learn everyone's at WIREUP:
//! transport.set_contacts(wireup);
//! while let Some(ev) = events.recv().await {
//!     match ev {
//!         TransportEvent::Frame { frame, .. } => match topo.route_to(frame.header.dst) {
//!             Route::Local => { /* hand to grpcomm / the daemon by frame.header.tag */ }
//!             Route::Up(hop) | Route::Down(hop) => transport.send(hop, frame)?, // relay
//!             Route::Unreachable => { /* drop, the destination is failed */ }
//!         },
//!         TransportEvent::PeerLost { peer, .. } | TransportEvent::ConnectFailed { peer, .. } => {
//!             // a tree neighbour: mark `peer` failed, repair the topology, re-drive
//!             let _ = peer;
//!         }
//!     }
//! }
//! transport.shutdown().await;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::admission::{Admission, Ticket};
use crate::auth::{self, DvmSecret, Established, Local, Role};
use crate::conn::{self, ConnEnd};
use crate::frame::{Frame, DEFAULT_MAX_FRAME};
use crate::link::LinkSecurity;
use crate::topology::Rank;

/// Settings of one daemon's transport. Heartbeat and max frame size must be the same on every
/// daemon of a DVM (a peer with heartbeats off looks silent to one with them on).
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// This daemon's rank.
    pub rank: Rank,
    /// This daemon's boot incarnation, claimed in every handshake.
    pub epoch: u64,
    /// Listener address; port 0 picks a free port (see [`Transport::local_addr`]).
    pub listen: SocketAddr,
    pub secret: DvmSecret,
    /// Largest accepted frame (bytes after the length prefix).
    pub max_frame: usize,
    /// Bound on each handshake, so a silent peer cannot hold a task.
    pub handshake_timeout: Duration,
    /// Connect attempts (connect + handshake) before `ConnectFailed`.
    pub connect_attempts: u32,
    /// Bound on one TCP connect.
    pub connect_timeout: Duration,
    /// Delay before the second attempt; doubles per attempt up to [`MAX_CONNECT_BACKOFF`].
    pub connect_backoff: Duration,
    /// Send a heartbeat on a connection that wrote nothing for this long; zero turns
    /// heartbeats and the read-idle check off.
    pub heartbeat: Duration,
    /// A connection that received nothing for `heartbeat * heartbeat_misses` is lost.
    pub heartbeat_misses: u32,
    /// Capacity of the event channel; a full channel pauses reading (TCP backpressure).
    pub event_capacity: usize,
    /// How frames are protected after the handshake; the same on every daemon.
    pub link_security: LinkSecurity,
    /// Accepted connections allowed to be in their handshake at once; one more closes the
    /// oldest of them (so a flood of idle or garbage connections costs bounded memory and
    /// descriptors, and never keeps a real peer out: see [`crate::admission`]).
    pub max_pending_handshakes: usize,
    /// Test hook: connections to this rank are dialed to this address instead, which is told
    /// the real contact in one line (`ip:port\n`) before the handshake (a forwarding proxy).
    pub dial_via: Option<(Rank, SocketAddr)>,
}

/// Default bound on accepted connections still in their handshake.
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 256;

/// Cap of the connect retry delay.
pub const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(2);

impl TransportConfig {
    /// Defaults: 100 MiB frames, 5 s handshake, 5 connect attempts (2 s each, 100 ms backoff),
    /// heartbeats off.
    pub fn new(rank: Rank, epoch: u64, listen: SocketAddr, secret: DvmSecret) -> Self {
        TransportConfig {
            rank,
            epoch,
            listen,
            secret,
            max_frame: DEFAULT_MAX_FRAME,
            handshake_timeout: auth::DEFAULT_HANDSHAKE_TIMEOUT,
            connect_attempts: 5,
            connect_timeout: Duration::from_secs(2),
            connect_backoff: Duration::from_millis(100),
            heartbeat: Duration::ZERO,
            heartbeat_misses: 3,
            event_capacity: 4096,
            link_security: LinkSecurity::DEFAULT,
            max_pending_handshakes: DEFAULT_MAX_PENDING_HANDSHAKES,
            dial_via: None,
        }
    }

    /// How long a connection may stay silent before it is declared lost, if heartbeats are on.
    pub fn read_idle(&self) -> Option<Duration> {
        (!self.heartbeat.is_zero()).then(|| self.heartbeat * self.heartbeat_misses)
    }

    fn validate(&self) -> Result<(), TransportError> {
        let bad = |reason: String| Err(TransportError::Config { rank: self.rank, reason });
        if self.rank == auth::TOOL_RANK {
            return bad(format!("rank {} is reserved for tools", auth::TOOL_RANK));
        }
        if self.max_frame < 64 || self.max_frame > u32::MAX as usize {
            return bad(format!("max_frame {} is outside 64..={}", self.max_frame, u32::MAX));
        }
        if self.connect_attempts == 0 {
            return bad("connect_attempts must be at least 1".into());
        }
        if self.handshake_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("handshake_timeout and connect_timeout must be positive".into());
        }
        if !self.heartbeat.is_zero() && self.heartbeat_misses == 0 {
            return bad("heartbeat_misses must be at least 1 when heartbeats are on".into());
        }
        if self.max_pending_handshakes == 0 {
            return bad("max_pending_handshakes must be at least 1".into());
        }
        if self.handshake_timeout > Duration::from_secs(30) {
            return bad(format!("handshake_timeout {:?} is above 30 s", self.handshake_timeout));
        }
        if self.event_capacity == 0 {
            return bad("event_capacity must be at least 1".into());
        }
        Ok(())
    }
}

/// What the transport tells its owner.
#[derive(Debug)]
pub enum TransportEvent {
    /// An authenticated peer sent a frame (heartbeats are not delivered).
    Frame { from_peer: Rank, frame: Frame },
    /// A connection with `peer` closed, failed or went silent.
    PeerLost { peer: Rank, reason: LinkError },
    /// Opening a connection to `peer` was given up; the frames queued for it are dropped.
    ConnectFailed { peer: Rank, reason: LinkError },
}

/// Why a link ended or could not be opened (the `reason` of an event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("connection closed by the peer")]
    Eof,
    #[error("i/o error: {0}")]
    Io(String),
    #[error("nothing received for {0:?} (heartbeat read-idle bound)")]
    ReadIdle(Duration),
    #[error("frame of {size} bytes exceeds the max message size of {max} bytes")]
    FrameTooLarge { size: u64, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame {seq} failed verification (altered, replayed, dropped or reordered in flight)")]
    Verification { seq: u64 },
    #[error("no contact address known")]
    NoContact,
    #[error("authentication with {addr} failed: {reason}")]
    Auth { addr: SocketAddr, reason: String },
    #[error("{addr} answered as rank {got}, not the rank dialed")]
    WrongPeer { addr: SocketAddr, got: Rank },
    #[error("gave up on {addr} after {attempts} attempts, last: {last}")]
    GaveUp { addr: SocketAddr, attempts: u32, last: String },
}

/// Errors returned to the caller of the transport's methods.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("rank {rank}: invalid transport configuration: {reason}")]
    Config { rank: Rank, reason: String },
    #[error("rank {rank}: cannot listen on {addr}: {source}")]
    Bind { rank: Rank, addr: SocketAddr, source: std::io::Error },
    #[error("rank {rank}: no contact address for peer {peer}")]
    NoContact { rank: Rank, peer: Rank },
    #[error("rank {rank}: refusing to send a frame to itself")]
    SelfSend { rank: Rank },
    #[error("rank {rank}: frame for peer {peer} has {size} bytes, above the max message size of {max}")]
    FrameTooLarge { rank: Rank, peer: Rank, size: usize, max: usize },
    #[error("rank {rank}: transport is shut down")]
    Closed { rank: Rank },
}

/// A daemon's RML transport. Dropping it stops every task it started (in the background);
/// [`Transport::shutdown`] also waits for them.
pub struct Transport {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
}

pub(crate) struct Shared {
    pub(crate) cfg: TransportConfig,
    table: Mutex<PeerTable>,
    pub(crate) events: mpsc::Sender<TransportEvent>,
    pub(crate) cancel: CancellationToken,
    tasks: TaskTracker,
    runtime: tokio::runtime::Handle,
    next_id: AtomicU64,
    /// Accepted connections still in their handshake; the oldest gives way to a newcomer.
    pending: Mutex<Admission<CancellationToken>>,
}

#[derive(Default)]
struct PeerTable {
    contacts: HashMap<Rank, SocketAddr>,
    /// Outbound queue per peer; present from the first send until the link ends.
    links: HashMap<Rank, OutLink>,
    /// Authenticated connections per peer, both directions.
    conns: HashMap<Rank, PeerConns>,
}

struct OutLink {
    id: u64,
    queue: mpsc::UnboundedSender<Frame>,
}

#[derive(Default)]
struct PeerConns {
    live: HashMap<u64, CancellationToken>,
    lost_reported: bool,
}

impl Transport {
    /// Bind the listener and start accepting. Returns the transport and the receiver of its
    /// events. Must be called inside a tokio runtime; tasks run on that runtime.
    pub async fn bind(cfg: TransportConfig) -> Result<(Transport, mpsc::Receiver<TransportEvent>), TransportError> {
        cfg.validate()?;
        let listener = TcpListener::bind(cfg.listen).await.map_err(|source| TransportError::Bind {
            rank: cfg.rank,
            addr: cfg.listen,
            source,
        })?;
        let local_addr = listener.local_addr().map_err(|source| TransportError::Bind {
            rank: cfg.rank,
            addr: cfg.listen,
            source,
        })?;
        let (events, rx) = mpsc::channel(cfg.event_capacity);
        let pending = Mutex::new(Admission::new(cfg.max_pending_handshakes));
        let shared = Arc::new(Shared {
            cfg,
            table: Mutex::new(PeerTable::default()),
            events,
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            runtime: tokio::runtime::Handle::current(),
            next_id: AtomicU64::new(1),
            pending,
        });
        debug!(rank = shared.cfg.rank, %local_addr, "RML listener bound");
        shared.spawn(accept_loop(shared.clone(), listener));
        Ok((Transport { shared, local_addr }, rx))
    }

    /// The address the listener is bound to (the port is real even if 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn rank(&self) -> Rank {
        self.shared.cfg.rank
    }

    /// Learn or change the listener address of `peer`; used by the next connection opened.
    pub fn set_contact(&self, peer: Rank, addr: SocketAddr) {
        self.shared.lock().contacts.insert(peer, addr);
    }

    /// Learn many contacts at once (e.g. the WIREUP table).
    pub fn set_contacts(&self, contacts: impl IntoIterator<Item = (Rank, SocketAddr)>) {
        self.shared.lock().contacts.extend(contacts);
    }

    pub fn contact(&self, peer: Rank) -> Option<SocketAddr> {
        self.shared.lock().contacts.get(&peer).copied()
    }

    /// Queue `frame` for the neighbour `next_hop`, opening a connection on first use.
    /// Never blocks. Errors name what is wrong now (no contact, oversized frame, shut down);
    /// later failures arrive as `PeerLost` / `ConnectFailed` events.
    pub fn send(&self, next_hop: Rank, frame: Frame) -> Result<(), TransportError> {
        let cfg = &self.shared.cfg;
        if next_hop == cfg.rank {
            return Err(TransportError::SelfSend { rank: cfg.rank });
        }
        let size = frame.body_len();
        if size > cfg.max_frame {
            return Err(TransportError::FrameTooLarge { rank: cfg.rank, peer: next_hop, size, max: cfg.max_frame });
        }
        if self.shared.cancel.is_cancelled() {
            return Err(TransportError::Closed { rank: cfg.rank });
        }
        let mut table = self.shared.lock();
        let frame = match table.links.get(&next_hop) {
            Some(link) => match link.queue.send(frame) {
                Ok(()) => return Ok(()),
                // The link task ended and has not removed itself yet: open a new one.
                Err(mpsc::error::SendError(frame)) => frame,
            },
            None => frame,
        };
        if !table.contacts.contains_key(&next_hop) {
            return Err(TransportError::NoContact { rank: cfg.rank, peer: next_hop });
        }
        let (queue, rx) = mpsc::unbounded_channel();
        queue.send(frame).expect("receiver is alive");
        let id = self.shared.next_id();
        table.links.insert(next_hop, OutLink { id, queue });
        drop(table);
        self.shared.spawn(outbound(self.shared.clone(), next_hop, id, rx));
        Ok(())
    }

    /// Close every connection with `peer` (e.g. it was declared failed) without reporting
    /// `PeerLost`; queued frames are dropped. A later `send` reconnects.
    pub fn disconnect(&self, peer: Rank) {
        let mut table = self.shared.lock();
        table.links.remove(&peer);
        if let Some(pc) = table.conns.get_mut(&peer) {
            for token in pc.live.values() {
                token.cancel();
            }
        }
    }

    /// Stop the listener and every connection, and wait until all their tasks have ended.
    pub async fn shutdown(self) {
        self.shared.cancel.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PeerTable> {
        // A panic while holding this lock leaves plain maps behind; they stay usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> MutexGuard<'_, Admission<CancellationToken>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Spawn a task that ends when the transport is cancelled.
    fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let cancel = self.cancel.clone();
        self.tasks.spawn_on(
            async move {
                cancel.run_until_cancelled(fut).await;
            },
            &self.runtime,
        );
    }

    pub(crate) async fn emit(&self, ev: TransportEvent) {
        // A dropped receiver means the owner is gone; there is nobody left to tell.
        let _ = self.events.send(ev).await;
    }

    /// Record a new authenticated connection with `peer`. For a connection opened by outbound
    /// link `link`, only while that link is still the peer's (else `None`).
    fn register(&self, peer: Rank, link: Option<u64>) -> Option<(u64, CancellationToken)> {
        let id = self.next_id();
        let token = self.cancel.child_token();
        let mut table = self.lock();
        if let Some(link) = link {
            if table.links.get(&peer).is_none_or(|l| l.id != link) {
                return None;
            }
        }
        let pc = table.conns.entry(peer).or_default();
        pc.live.insert(id, token.clone());
        pc.lost_reported = false;
        Some((id, token))
    }

    /// Book-keep the end of connection `id` with `peer` and decide whether it is reported.
    /// A lost outbound link is always reported (its queued frames may be gone); a lost
    /// inbound connection only when no other connection with the peer remains, or when it
    /// ended on a frame that failed verification.
    fn closed(&self, peer: Rank, id: u64, link: Option<u64>, end: ConnEnd) -> Option<TransportEvent> {
        let mut table = self.lock();
        if let Some(link_id) = link {
            if table.links.get(&peer).is_some_and(|l| l.id == link_id) {
                table.links.remove(&peer);
            }
        }
        let pc = table.conns.entry(peer).or_default();
        pc.live.remove(&id);
        let reason = match end {
            ConnEnd::Closed => return None,
            ConnEnd::Lost(reason) => reason,
        };
        // A frame that failed verification is an attack or a broken path, never routine: it is
        // reported even while another connection with the peer is up.
        let forged = matches!(reason, LinkError::Verification { .. });
        if (link.is_some() || pc.live.is_empty() || forged) && !pc.lost_reported {
            pc.lost_reported = true;
            Some(TransportEvent::PeerLost { peer, reason })
        } else {
            None
        }
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut evicted: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                let token = shared.cancel.child_token();
                let (ticket, gone) = shared.pending().admit(token.clone());
                if let Some((_, oldest)) = gone {
                    // Logged for the first and then every 1000th.
                    if evicted.is_multiple_of(1000) {
                        warn!(rank = shared.cfg.rank, %addr, evicted = evicted + 1, max = shared.cfg.max_pending_handshakes,
                            "too many RML connections still in their handshake: closing the oldest to admit a new one");
                    }
                    evicted += 1;
                    oldest.cancel();
                }
                shared.spawn(inbound(shared.clone(), stream, addr, ticket, token));
            }
            Err(e) => {
                // E.g. out of file descriptors: keep the listener, back off briefly.
                warn!(rank = shared.cfg.rank, error = %e, "RML accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Shared {
    fn local(&self, role: Role) -> Local<'_> {
        let cfg = &self.cfg;
        Local { secret: &cfg.secret, role, rank: cfg.rank, epoch: cfg.epoch, mode: cfg.link_security }
    }
}

async fn inbound(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    addr: SocketAddr,
    ticket: Ticket,
    token: CancellationToken,
) {
    let cfg = &shared.cfg;
    let _ = stream.set_nodelay(true);
    let shake = auth::handshake(&mut stream, shared.local(Role::Responder), cfg.handshake_timeout);
    let res = token.run_until_cancelled(shake).await;
    shared.pending().finished(ticket);
    let Some(res) = res else {
        debug!(rank = cfg.rank, %addr, "closed an unauthenticated RML connection to admit a newer one");
        return;
    };
    let est = match res {
        Ok(est) if est.peer.is_tool() || est.peer.rank == cfg.rank => {
            warn!(rank = cfg.rank, %addr, claimed = est.peer.rank, "refused RML connection: not a peer daemon");
            return;
        }
        Ok(est) => est,
        Err(e) => {
            warn!(rank = cfg.rank, %addr, error = %e, "refused RML connection: authentication failed");
            return;
        }
    };
    let peer = est.peer;
    debug!(rank = cfg.rank, peer = peer.rank, peer_epoch = peer.epoch, %addr, "accepted RML connection");
    let (id, token) = shared.register(peer.rank, None).expect("an accepted connection is always registered");
    let link = est.link(&cfg.secret, cfg.max_frame);
    let end = conn::run(&shared, stream, peer.rank, addr, None, link, token).await;
    if let Some(ev) = shared.closed(peer.rank, id, None, end) {
        shared.emit(ev).await;
    }
}

/// Why one dial attempt failed, and whether another attempt could help.
struct DialFailure {
    reason: LinkError,
    retry: bool,
}

async fn outbound(shared: Arc<Shared>, peer: Rank, link: u64, queue: mpsc::UnboundedReceiver<Frame>) {
    let cfg = &shared.cfg;
    let mut delay = cfg.connect_backoff;
    let mut attempts = 0;
    let mut last = LinkError::NoContact;
    let mut addr = None;
    while attempts < cfg.connect_attempts {
        if attempts > 0 {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_CONNECT_BACKOFF);
        }
        attempts += 1;
        // Re-read each attempt: WIREUP may have changed the address meanwhile.
        let Some(a) = shared.lock().contacts.get(&peer).copied() else {
            break;
        };
        addr = Some(a);
        match dial(&shared, peer, a).await {
            Ok((stream, est)) => {
                // None: `disconnect` dropped this link while it was dialing; drop its frames too.
                let Some((id, token)) = shared.register(peer, Some(link)) else { return };
                debug!(rank = cfg.rank, peer, addr = %a, "RML connection open");
                let keys = est.link(&cfg.secret, cfg.max_frame);
                let end = conn::run(&shared, stream, peer, a, Some(queue), keys, token).await;
                if let Some(ev) = shared.closed(peer, id, Some(link), end) {
                    shared.emit(ev).await;
                }
                return;
            }
            Err(DialFailure { reason, retry }) => {
                debug!(rank = cfg.rank, peer, addr = %a, attempt = attempts, %reason, "RML connect attempt failed");
                last = reason;
                if !retry {
                    break;
                }
            }
        }
    }
    let reason = match (addr, last) {
        (Some(addr), last @ LinkError::Io(_)) => LinkError::GaveUp { addr, attempts, last: last.to_string() },
        (_, last) => last,
    };
    warn!(rank = cfg.rank, peer, %reason, "giving up connecting to peer");
    {
        let mut table = shared.lock();
        if table.links.get(&peer).is_some_and(|l| l.id == link) {
            table.links.remove(&peer);
        }
    }
    drop(queue);
    shared.emit(TransportEvent::ConnectFailed { peer, reason }).await;
}

async fn dial(shared: &Shared, peer: Rank, addr: SocketAddr) -> Result<(TcpStream, Established), DialFailure> {
    let cfg = &shared.cfg;
    let io = |e: String| DialFailure { reason: LinkError::Io(e), retry: true };
    let via = cfg.dial_via.filter(|(r, _)| *r == peer).map(|(_, via)| via);
    let mut stream = match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(via.unwrap_or(addr))).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(io(e.to_string())),
        Err(_) => return Err(io(format!("connect timed out after {:?}", cfg.connect_timeout))),
    };
    let _ = stream.set_nodelay(true);
    if via.is_some() {
        use tokio::io::AsyncWriteExt;
        stream.write_all(format!("{addr}\n").as_bytes()).await.map_err(|e| io(e.to_string()))?;
    }
    match auth::handshake(&mut stream, shared.local(Role::Initiator), cfg.handshake_timeout).await {
        Ok(est) if est.peer.rank == peer => Ok((stream, est)),
        Ok(est) => {
            let got = est.peer.rank;
            warn!(rank = cfg.rank, peer, %addr, got, "dialed peer answered with another rank");
            Err(DialFailure { reason: LinkError::WrongPeer { addr, got }, retry: false })
        }
        Err(e) if e.is_refusal() => {
            warn!(rank = cfg.rank, peer, %addr, error = %e, "dialed peer failed authentication; not connecting");
            Err(DialFailure { reason: LinkError::Auth { addr, reason: e.to_string() }, retry: false })
        }
        Err(e) => Err(io(e.to_string())),
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").field("rank", &self.shared.cfg.rank).field("local_addr", &self.local_addr).finish()
    }
}
