//! One task per prun stream: the daemon's output and job events, in order, onto prun's gRPC
//! stream, and the credit for delivered bytes back to the actor.
//!
//! Owns: nothing the actor decides on; it only carries. Never: drops an event the actor sent
//! before the stream's end, or ends a job itself: prun going away is reported
//! (`PrunEvent::Gone`) and the node decides. Do not break: `Delivered` is sent for every output
//! chunk, read or not, so the job's output window always reopens.

use dvm_core::jobs::{ClientId, Forward};
use dvm_core::node::PrunEvent;
use dvm_proto::control::{job_event, JobEvent, JobOutput};
use tokio::sync::mpsc;
use tonic::Status;

fn event_of(item: job_event::Event) -> JobEvent {
    JobEvent { event: Some(item) }
}

/// Per-prun task: hands output and events to prun's stream in order, then tells the actor the
/// bytes were delivered (the credit the daemon waits for).
pub(crate) async fn forwarder(
    client: ClientId,
    mut rx: mpsc::UnboundedReceiver<Forward>,
    tx: mpsc::Sender<Result<JobEvent, Status>>,
    actor: mpsc::UnboundedSender<PrunEvent>,
) {
    let mut client_alive = true;
    loop {
        let item = tokio::select! {
            item = rx.recv() => match item {
                Some(i) => i,
                None => return,
            },
            // prun went away (Ctrl-C'd hard, killed, lost): the job must not outlive it.
            _ = tx.closed(), if client_alive => {
                client_alive = false;
                let _ = actor.send(PrunEvent::Gone(client));
                continue;
            }
        };
        match item {
            Forward::Output { daemon, chunk } => {
                let (jobid, bytes) = (chunk.jobid, chunk.data.len() as u64);
                if client_alive {
                    let ev = event_of(job_event::Event::Output(JobOutput {
                        rank: chunk.rank,
                        stream: chunk.stream,
                        data: chunk.data,
                        jobid,
                        read_at_us: chunk.read_at_us,
                    }));
                    if tx.send(Ok(ev)).await.is_err() {
                        client_alive = false;
                        let _ = actor.send(PrunEvent::Gone(client));
                    }
                }
                let _ = actor.send(PrunEvent::Delivered { jobid, daemon, bytes });
            }
            Forward::Event(ev) => {
                // An array element's end is not the stream's.
                let last = matches!(&ev.event, Some(job_event::Event::Ended(e)) if !e.element);
                if client_alive && tx.send(Ok(ev)).await.is_err() {
                    client_alive = false;
                    let _ = actor.send(PrunEvent::Gone(client));
                }
                if last {
                    // Until prun hangs up, the stream may still hold what it has not read.
                    tx.closed().await;
                    let _ = actor.send(PrunEvent::Closed(client));
                    return;
                }
            }
            Forward::Refused(why) => {
                let _ = tx.try_send(Err(Status::unavailable(why)));
                return;
            }
            Forward::Close => return,
        }
    }
}
