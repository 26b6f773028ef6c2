//! What a worker tells the daemon: [`HostEvent`]s (its upcalls and data answers in their wire
//! form, the end of its event stream) read by one thread per worker and posted, tagged with the
//! worker's generation, into the actor's channel.
//!
//! Never answers an upcall (the node does, even one it does not know). Do not break: the last
//! item a reader posts is [`HostEvent::Ended`], and a reader stops once the actor's channel is
//! closed.

use std::io::BufReader;
use std::os::unix::net::UnixStream;

use dvm_proto::pmixworker as wire;
use tokio::sync::mpsc;

use crate::pmix::frame::read_frame;

/// What the daemon learns from its worker.
#[derive(Debug)]
pub(crate) enum HostEvent {
    /// An upcall (or a data answer) in its wire form, with its reply id (0: none).
    Upcall(wire::WorkerEvent),
    /// The worker's event stream ended: it exited or was killed.
    Ended { how: String },
}

/// Channel items: the worker generation an event came from, and the event.
pub(crate) type EventTx = mpsc::UnboundedSender<(u64, HostEvent)>;

/// The event thread of one worker: every frame becomes a [`HostEvent`]; the end of the
/// stream becomes [`HostEvent::Ended`].
pub(super) fn read_events(sock: UnixStream, gen: u64, tx: EventTx) {
    let mut r = BufReader::new(sock);
    let how = loop {
        let ev = match read_frame::<wire::WorkerEvent>(&mut r) {
            Ok(Some(ev)) => ev,
            Ok(None) => break "its event stream ended".to_string(),
            Err(e) => break format!("its event stream broke: {e}"),
        };
        if tx.send((gen, HostEvent::Upcall(ev))).is_err() {
            return;
        }
    };
    let _ = tx.send((gen, HostEvent::Ended { how }));
}
