//! The control API (tonic gRPC, served by the HNP) and its authenticated client.
//!
//! Every call but `Challenge` carries metadata `dvm-auth: <nonce hex>:<mac hex>` where the
//! nonce came from `Challenge` and the MAC is HMAC-SHA256(secret, "dvm-ctl" | method | nonce).
//! A call without a valid proof is refused with `Unauthenticated` and logged; nothing it asked
//! for is done.
//!
//! Replay window: a nonce is issued once, lives [`NONCE_TTL`], and is consumed by the first
//! call that presents it (valid or not), so a recorded call replayed later, or a proof made for
//! one method presented to another, is refused. At most [`MAX_NONCES`] challenges are
//! outstanding. For a `--local` DVM the control API listens on loopback only.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dvm_proto::control::control_client::ControlClient;
use dvm_proto::control::control_server::{Control, ControlServer};
use dvm_proto::control::*;
use dvm_proto::job::JobSpec;
use dvm_rml::DvmSecret;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::session::DvmUri;

/// How long an issued challenge nonce may be used.
pub const NONCE_TTL: Duration = Duration::from_secs(30);
/// Most challenges outstanding at once.
pub const MAX_NONCES: usize = 4096;

fn mac(secret: &DvmSecret, method: &str, nonce: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    m.update(b"dvm-ctl");
    m.update(method.as_bytes());
    m.update(b"\0");
    m.update(nonce);
    m
}

/// The `dvm-auth` metadata value proving `secret` for one call of `method` (e.g. `"status"`)
/// with the challenge `nonce`.
pub fn proof(secret: &DvmSecret, method: &str, nonce: &[u8]) -> String {
    format!("{}:{}", hex::encode(nonce), hex::encode(mac(secret, method, nonce).finalize().into_bytes()))
}

/// A request from the control API to the HNP's actor, with its reply channel.
#[derive(Debug)]
pub enum ControlCmd {
    Status(oneshot::Sender<StatusReply>),
    Terminate(oneshot::Sender<TerminateReply>),
    TreeViews(oneshot::Sender<Result<TreeViewsReply, String>>),
    Bench(BenchRequest, oneshot::Sender<Result<BenchReply, String>>),
    /// Launch a job; its events go to the stream until `JobEnded`.
    Launch(JobSpec, mpsc::Sender<Result<JobEvent, Status>>),
    LaunchPlan(JobSpec, oneshot::Sender<Result<LaunchPlanReply, String>>),
    Stdin(StdinMsg),
    Signal(SignalRequest, oneshot::Sender<SignalReply>),
    /// The job tools: list (with the nodes when true), cancel, attach.
    Jobs(bool, oneshot::Sender<JobsReply>),
    Cancel(CancelRequest, oneshot::Sender<CancelReply>),
    Attach(AttachRequest, mpsc::Sender<Result<JobEvent, Status>>),
    StackTraces(StackTracesRequest, oneshot::Sender<Result<StackTracesReply, String>>),
    /// Copy files to the daemons (the broadcast tool).
    Stage(dvm_proto::control::StageRequest, oneshot::Sender<dvm_proto::control::StageReply>),
}

/// The gRPC service; forwards each authenticated call to the actor.
pub struct ControlService {
    secret: DvmSecret,
    nonces: Arc<Mutex<HashMap<[u8; 32], Instant>>>,
    actor: mpsc::Sender<ControlCmd>,
}

impl ControlService {
    pub fn new(secret: DvmSecret, actor: mpsc::Sender<ControlCmd>) -> ControlServer<ControlService> {
        ControlServer::new(ControlService { secret, nonces: Arc::default(), actor })
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(256 << 20)
    }

    #[allow(clippy::result_large_err)] // tonic's own error type
    fn check<T>(&self, req: &Request<T>, method: &str) -> Result<(), Status> {
        let peer = req.remote_addr().map_or_else(|| "unknown address".to_string(), |a| a.to_string());
        #[allow(clippy::result_large_err)]
        let refuse = |why: &str| {
            warn!(%peer, method, "control call refused: {why}");
            Err(Status::unauthenticated(format!("control call refused: {why}")))
        };
        let Some(value) = req.metadata().get("dvm-auth").and_then(|v| v.to_str().ok()) else {
            return refuse("no dvm-auth proof");
        };
        let Some((nonce_hex, mac_hex)) = value.split_once(':') else { return refuse("malformed dvm-auth proof") };
        let (Ok(nonce), Ok(tag)) = (hex::decode(nonce_hex), hex::decode(mac_hex)) else {
            return refuse("malformed dvm-auth proof");
        };
        let Ok(key) = <[u8; 32]>::try_from(nonce.as_slice()) else { return refuse("malformed nonce") };
        let issued = self.nonces.lock().expect("nonce table").remove(&key);
        match issued {
            Some(at) if at.elapsed() < NONCE_TTL => {}
            _ => return refuse("unknown, already used or expired nonce (a replayed call?)"),
        }
        if mac(&self.secret, method, &nonce).verify_slice(&tag).is_err() {
            return refuse("wrong DVM secret, or a proof made for another call");
        }
        Ok(())
    }

    async fn ask<R>(&self, make: impl FnOnce(oneshot::Sender<R>) -> ControlCmd) -> Result<R, Status> {
        let (tx, rx) = oneshot::channel();
        self.actor.send(make(tx)).await.map_err(|_| Status::unavailable("the DVM is shutting down"))?;
        rx.await.map_err(|_| Status::unavailable("the DVM is shutting down"))
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn challenge(&self, _req: Request<ChallengeRequest>) -> Result<Response<ChallengeReply>, Status> {
        let nonce: [u8; 32] = rand::random();
        let mut table = self.nonces.lock().expect("nonce table");
        table.retain(|_, at| at.elapsed() < NONCE_TTL);
        if table.len() >= MAX_NONCES {
            return Err(Status::resource_exhausted("too many outstanding control challenges"));
        }
        table.insert(nonce, Instant::now());
        Ok(Response::new(ChallengeReply { nonce: nonce.to_vec().into() }))
    }

    async fn status(&self, req: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        self.check(&req, "status")?;
        Ok(Response::new(self.ask(ControlCmd::Status).await?))
    }

    async fn terminate(&self, req: Request<TerminateRequest>) -> Result<Response<TerminateReply>, Status> {
        self.check(&req, "terminate")?;
        Ok(Response::new(self.ask(ControlCmd::Terminate).await?))
    }

    async fn tree_views(&self, req: Request<TreeViewsRequest>) -> Result<Response<TreeViewsReply>, Status> {
        self.check(&req, "tree_views")?;
        self.ask(ControlCmd::TreeViews).await?.map(Response::new).map_err(Status::internal)
    }

    type LaunchStream = tokio_stream::wrappers::ReceiverStream<Result<JobEvent, Status>>;

    async fn launch(&self, req: Request<LaunchRequest>) -> Result<Response<Self::LaunchStream>, Status> {
        self.check(&req, "launch")?;
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("launch request without a job"))?;
        let (tx, rx) = mpsc::channel(64);
        self.actor
            .send(ControlCmd::Launch(spec, tx))
            .await
            .map_err(|_| Status::unavailable("the DVM is shutting down"))?;
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn launch_plan(&self, req: Request<LaunchRequest>) -> Result<Response<LaunchPlanReply>, Status> {
        self.check(&req, "launch_plan")?;
        let spec = req.into_inner().spec.ok_or_else(|| Status::invalid_argument("launch request without a job"))?;
        self.ask(|tx| ControlCmd::LaunchPlan(spec, tx)).await?.map(Response::new).map_err(Status::invalid_argument)
    }

    async fn stdin(&self, req: Request<tonic::Streaming<StdinMsg>>) -> Result<Response<StdinReply>, Status> {
        self.check(&req, "stdin")?;
        let mut stream = req.into_inner();
        while let Some(msg) = stream.message().await? {
            self.actor
                .send(ControlCmd::Stdin(msg))
                .await
                .map_err(|_| Status::unavailable("the DVM is shutting down"))?;
        }
        Ok(Response::new(StdinReply {}))
    }

    async fn signal(&self, req: Request<SignalRequest>) -> Result<Response<SignalReply>, Status> {
        self.check(&req, "signal")?;
        let body = req.into_inner();
        Ok(Response::new(self.ask(|tx| ControlCmd::Signal(body, tx)).await?))
    }

    async fn jobs(&self, req: Request<JobsRequest>) -> Result<Response<JobsReply>, Status> {
        self.check(&req, "jobs")?;
        let nodes = req.into_inner().nodes;
        Ok(Response::new(self.ask(|tx| ControlCmd::Jobs(nodes, tx)).await?))
    }

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        self.check(&req, "cancel")?;
        let body = req.into_inner();
        Ok(Response::new(self.ask(|tx| ControlCmd::Cancel(body, tx)).await?))
    }

    async fn stack_traces(&self, req: Request<StackTracesRequest>) -> Result<Response<StackTracesReply>, Status> {
        self.check(&req, "stack_traces")?;
        let body = req.into_inner();
        self.ask(|tx| ControlCmd::StackTraces(body, tx)).await?.map(Response::new).map_err(Status::not_found)
    }

    type AttachStream = tokio_stream::wrappers::ReceiverStream<Result<JobEvent, Status>>;

    async fn attach(&self, req: Request<AttachRequest>) -> Result<Response<Self::AttachStream>, Status> {
        self.check(&req, "attach")?;
        let body = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        self.actor
            .send(ControlCmd::Attach(body, tx))
            .await
            .map_err(|_| Status::unavailable("the DVM is shutting down"))?;
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn stage(
        &self,
        req: Request<dvm_proto::control::StageRequest>,
    ) -> Result<Response<dvm_proto::control::StageReply>, Status> {
        self.check(&req, "stage")?;
        let body = req.into_inner();
        Ok(Response::new(self.ask(|tx| ControlCmd::Stage(body, tx)).await?))
    }

    async fn bench(&self, req: Request<BenchRequest>) -> Result<Response<BenchReply>, Status> {
        self.check(&req, "bench")?;
        let body = req.into_inner();
        self.ask(|tx| ControlCmd::Bench(body, tx)).await?.map(Response::new).map_err(Status::internal)
    }
}

/// Serve the control API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    svc: ControlServer<ControlService>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream_from(listener);
    tonic::transport::Server::builder().add_service(svc).serve_with_incoming_shutdown(incoming, shutdown).await
}

fn tokio_stream_from(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = Result<tokio::net::TcpStream, std::io::Error>> {
    use tokio_stream::StreamExt;
    // Small request/response frames: without TCP_NODELAY a second frame waits for the
    // peer's delayed ACK (~40 ms per call).
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

/// A call's answer; a status of `code` is the DVM's refusal, shown as its sentence alone.
fn sentence<T>(r: Result<tonic::Response<T>, Status>, code: tonic::Code) -> Result<T> {
    match r {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == code => Err(anyhow::anyhow!("{}", s.message())),
        Err(s) => Err(s.into()),
    }
}

/// This process's user, as the calls that act on a job say it.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// An authenticated control client.
pub struct Client {
    inner: ControlClient<tonic::transport::Channel>,
    secret: DvmSecret,
    pub uri: DvmUri,
}

impl Client {
    pub async fn connect(uri: DvmUri) -> Result<Client> {
        // A URI kept from an earlier DVM (a `--report-uri` file, say): say so, not which path
        // could not be read.
        if std::fs::symlink_metadata(&uri.session).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            bail!(
                "no DVM runs at {uri}: its session directory {} is gone (that DVM ended, or was stopped \
                 with pterm)",
                uri.session.display()
            );
        }
        if let Some(pid) = uri.hnp_pid().filter(|&p| crate::session::process_gone(p)) {
            bail!("no DVM runs at {uri}: its head process (dvmd, pid {pid}) has ended");
        }
        crate::session::check_private_dir(&uri.session)?;
        let secret =
            DvmSecret::read_file(&uri.secret_path()).with_context(|| format!("cannot read the DVM secret of {uri}"))?;
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", uri.control))
            .context("bad control address")?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        let inner = ControlClient::connect(endpoint)
            .await
            .with_context(|| format!("cannot reach the DVM control API at {}", uri.control))?
            .max_decoding_message_size(256 << 20);
        Ok(Client { inner, secret, uri })
    }

    async fn authed<T>(&mut self, method: &str, body: T) -> Result<Request<T>> {
        let nonce =
            self.inner.challenge(ChallengeRequest {}).await.context("control challenge failed")?.into_inner().nonce;
        let mut req = Request::new(body);
        let value = proof(&self.secret, method, &nonce);
        req.metadata_mut().insert("dvm-auth", value.parse().expect("hex is valid metadata"));
        Ok(req)
    }

    pub async fn status(&mut self) -> Result<StatusReply> {
        let req = self.authed("status", StatusRequest {}).await?;
        Ok(self.inner.status(req).await?.into_inner())
    }
    pub async fn terminate(&mut self) -> Result<TerminateReply> {
        let req = self.authed("terminate", TerminateRequest {}).await?;
        Ok(self.inner.terminate(req).await?.into_inner())
    }
    pub async fn tree_views(&mut self) -> Result<TreeViewsReply> {
        let req = self.authed("tree_views", TreeViewsRequest {}).await?;
        Ok(self.inner.tree_views(req).await?.into_inner())
    }
    pub async fn launch(&mut self, spec: JobSpec) -> Result<tonic::Streaming<JobEvent>> {
        let req = self.authed("launch", LaunchRequest { spec: Some(spec) }).await?;
        Ok(self.inner.launch(req).await?.into_inner())
    }
    pub async fn launch_plan(&mut self, spec: JobSpec) -> Result<LaunchPlanReply> {
        let req = self.authed("launch_plan", LaunchRequest { spec: Some(spec) }).await?;
        // A refused plan (the job does not map) is the DVM's sentence, not an RPC status.
        sentence(self.inner.launch_plan(req).await, tonic::Code::InvalidArgument)
    }
    pub async fn stdin(&mut self, input: impl tokio_stream::Stream<Item = StdinMsg> + Send + 'static) -> Result<()> {
        let req = self.authed("stdin", input).await?;
        self.inner.stdin(req).await?;
        Ok(())
    }
    pub async fn signal(&mut self, jobid: u32, signal: i32) -> Result<()> {
        let req = self.authed("signal", SignalRequest { jobid, signal, uid: uid() }).await?;
        let reply = self.inner.signal(req).await?.into_inner();
        if !reply.ok {
            bail!("{}", reply.error);
        }
        Ok(())
    }
    pub async fn jobs(&mut self, nodes: bool) -> Result<JobsReply> {
        let req = self.authed("jobs", JobsRequest { nodes }).await?;
        Ok(self.inner.jobs(req).await?.into_inner())
    }
    pub async fn cancel(&mut self, body: CancelRequest) -> Result<CancelReply> {
        let req = self.authed("cancel", body).await?;
        Ok(self.inner.cancel(req).await?.into_inner())
    }
    /// Every rank's stacks of a running job; Err(sentence) when there is no such job.
    pub async fn stack_traces(&mut self, jobid: u32) -> Result<StackTracesReply> {
        let req = self.authed("stack_traces", StackTracesRequest { jobid, uid: uid() }).await?;
        sentence(self.inner.stack_traces(req).await, tonic::Code::NotFound)
    }
    pub async fn attach(&mut self, jobid: u32) -> Result<tonic::Streaming<JobEvent>> {
        let req = self.authed("attach", AttachRequest { jobid, uid: uid() }).await?;
        Ok(self.inner.attach(req).await?.into_inner())
    }
    pub async fn stage(&mut self, body: dvm_proto::control::StageRequest) -> Result<dvm_proto::control::StageReply> {
        let req = self.authed("stage", body).await?;
        Ok(self.inner.stage(req).await?.into_inner())
    }

    pub async fn bench(&mut self, body: BenchRequest) -> Result<BenchReply> {
        let req = self.authed("bench", body).await?;
        Ok(self.inner.bench(req).await?.into_inner())
    }
}

/// Address a control listener should bind for a DVM whose HNP advertises `hnp`: loopback for
/// a `--local` DVM (whatever `--bind-address` says), else the HNP's address.
pub fn control_bind(hnp: SocketAddr, local: bool) -> SocketAddr {
    let ip = if local { std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) } else { hnp.ip() };
    SocketAddr::new(ip, 0)
}
