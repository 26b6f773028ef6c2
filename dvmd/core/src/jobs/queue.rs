//! HNP: the DVM's slot books and its queue. One set of books for every job (prun's and
//! spawned): a job holds the slots of its placement from launch until it leaves the table.
//!
//! Submission: a job that can never fit the live DVM is refused at once (the mapper's
//! sentence names the DVM's slots). One that fits the free slots now starts, unless jobs wait
//! before it; otherwise it waits in a FIFO queue (or is refused with `--no-queue`) and starts
//! as soon as it is at the head and fits. Nothing starts ahead of a blocked head, so no job
//! starves. `--oversubscribe` takes free slots when it can and shares busy ones otherwise,
//! without waiting. An array is one queue entry that starts its elements in index order.
//!
//! Never: a slot given to two jobs (without `--oversubscribe`), a queued job with no prun
//! left to hear of it (prun gone, cancelled: it leaves the queue).

use std::collections::{BTreeMap, VecDeque};

use dvm_proto::control::{job_event, JobEnded, JobInfo, JobQueued, JobStarted};
use dvm_proto::job::{BindTo, JobSpec};
use tracing::{debug, info, warn};

use super::hnp::JobTable;
pub(crate) use super::records::{ArrayState, Waiting};
use super::{event, ClientId};
use crate::jobmap::{self, NodeSlots, Placement};
use crate::Core;

/// Most jobs that may wait at once (array elements counted).
pub const MAX_QUEUED: u64 = 100_000;
/// Most elements of one array.
pub const MAX_ARRAY: u64 = 100_000;
/// The environment variable that gives an array element its index.
pub const ARRAY_INDEX_VAR: &str = "DVM_ARRAY_INDEX";

/// Whether a job fits now.
pub(crate) enum Fit {
    Now(Placement),
    /// Not now: why (for the queue notice).
    Later(String),
    /// Never on this DVM: the sentence.
    Never(String),
}

/// `nodes` minus what `used` holds; nodes with nothing left are dropped.
pub fn free_nodes(nodes: &[NodeSlots], used: &BTreeMap<u32, u32>) -> Vec<NodeSlots> {
    nodes
        .iter()
        .map(|n| NodeSlots { slots: n.slots.saturating_sub(used.get(&n.daemon).copied().unwrap_or(0)), ..n.clone() })
        .filter(|n| n.slots > 0)
        .collect()
}

/// `spec` with each app's process count as `whole` resolved it (a "fill the slots" app asks
/// for the whole DVM's slots, wherever it is placed).
fn resolved(spec: &JobSpec, whole: &Placement) -> JobSpec {
    let mut s = spec.clone();
    for (i, app) in s.apps.iter_mut().enumerate() {
        if let Some(r) = whole.app_ranks(i as u32) {
            app.np = r.end - r.start;
        }
    }
    s.oversubscribe = false;
    s
}

impl JobTable {
    /// The DVM's slots now: what its jobs see as their universe (`MPI_UNIVERSE_SIZE`, as
    /// mpirun gives its allocation's slots). Kept in `universe` by the caller before a launch.
    pub(crate) fn note_universe(&mut self, r: &Core) {
        self.universe = Self::candidate_nodes(r).iter().map(|n| n.slots).sum();
    }

    pub(crate) fn candidate_nodes(r: &Core) -> Vec<NodeSlots> {
        let Some(contacts) = r.contacts() else { return Vec::new() };
        let topo = r.topology();
        contacts
            .values()
            .filter(|c| topo.is_alive(c.rank) && c.slots > 0)
            .map(|c| NodeSlots { topo: r.hardware_of(c.rank), ..NodeSlots::new(c.rank, c.host.clone(), c.slots) })
            .collect()
    }

    /// Procs of the jobs in the table, per daemon.
    pub(crate) fn used_slots(&self) -> BTreeMap<u32, u32> {
        let mut used = BTreeMap::new();
        for job in self.jobs.values() {
            let p = &job.placement;
            for d in p.daemons() {
                *used.entry(d).or_insert(0) += p.procs_on(d).len();
            }
        }
        used
    }

    /// Who holds the DVM's slots: "8 slots, 7 in use (job 1: 4, job 2: 3)".
    pub(crate) fn holders(&self, r: &Core) -> String {
        let total: u64 = Self::candidate_nodes(r).iter().map(|n| u64::from(n.slots)).sum();
        let mut used = 0u64;
        let mut by: Vec<String> = Vec::new();
        for (id, job) in &self.jobs {
            let n = job.placement.nprocs();
            used += u64::from(n);
            if by.len() < 8 {
                by.push(format!("job {id}: {n}"));
            }
        }
        if self.jobs.len() > by.len() {
            by.push(format!("{} more jobs", self.jobs.len() - by.len()));
        }
        let held = if by.is_empty() { String::new() } else { format!(" ({})", by.join(", ")) };
        format!("the DVM has {total} slots, {used} in use{held}")
    }

    /// Whether `spec` fits the live DVM now, later, or never.
    pub(crate) fn fit(&self, r: &Core, spec: &JobSpec) -> Fit {
        let all = Self::candidate_nodes(r);
        let whole = match jobmap::map_job(spec, &all) {
            Ok(p) => p,
            Err(e) => return Fit::Never(e.to_string()),
        };
        let free = free_nodes(&all, &self.used_slots());
        match jobmap::map_job(&resolved(spec, &whole), &free) {
            Ok(p) => Fit::Now(p),
            // Oversubscribed by request: shares busy slots rather than wait.
            Err(_) if spec.oversubscribe => Fit::Now(whole),
            Err(_) => {
                let n = whole.nprocs();
                Fit::Later(format!("it needs {n} slot{}; {}", if n == 1 { "" } else { "s" }, self.holders(r)))
            }
        }
    }

    /// Jobs waiting (array elements counted).
    pub fn queued(&self) -> u64 {
        self.queue.iter().map(Waiting::count).sum()
    }

    /// A prun's job (or array): started, queued, or refused with one sentence (the stream's
    /// last). Returns the job id it was given.
    pub(crate) fn submit(&mut self, r: &Core, mut spec: JobSpec, client: ClientId) -> Option<u32> {
        let refuse = |t: &mut Self, message: String| {
            let ended = JobEnded { exit_code: 1, message, ..Default::default() };
            t.tell(client, event(job_event::Event::Ended(ended)));
            None
        };
        let next = match spec.array.take() {
            None => None,
            Some(a) if a.first > a.last => {
                return refuse(self, format!("--array {}-{}: the first index is above the last", a.first, a.last))
            }
            Some(a) if u64::from(a.last - a.first) + 1 > MAX_ARRAY => {
                let n = u64::from(a.last - a.first) + 1;
                return refuse(
                    self,
                    format!("--array {}-{}: {n} jobs, more than the {MAX_ARRAY} an array may hold", a.first, a.last),
                );
            }
            Some(a) => Some((a.first, a.last)),
        };
        if next.is_some() && spec.detach {
            return refuse(self, "--detach cannot be used with --array (an array's summary needs its prun)".into());
        }
        if next.is_some() && (spec.oversubscribe || spec.no_queue) {
            let opt = if spec.oversubscribe { "--oversubscribe" } else { "--no-queue" };
            return refuse(self, format!("{opt} cannot be used with --array (its elements wait for free slots)"));
        }
        let w = Waiting { jobid: self.new_jobid(), spec, client, since: self.now, next, attached: false };
        debug!(jobid = w.jobid, "job submitted");
        if let Fit::Never(e) = self.fit(r, &w.spec) {
            return refuse(self, e);
        }
        let jobid = w.jobid;
        if let Some((first, last)) = w.next {
            let total = u64::from(last - first) + 1;
            let st =
                ArrayState { client, total, ended: 0, failed: 0, unrun: 0, first_failure: None, spec: w.spec.clone() };
            self.arrays.insert(jobid, st);
        }
        if w.spec.oversubscribe {
            // Oversubscribed by request: never waits, shares busy slots when it must.
            if let Fit::Now(p) = self.fit(r, &w.spec) {
                self.queue.push_front(w);
                self.start_head(r, p);
            }
            return Some(jobid);
        }
        if self.queue.is_empty() {
            self.queue.push_back(w);
            self.drain_queue(r);
            if self.queue.back().is_none_or(|b| b.jobid != jobid) {
                return Some(jobid);
            }
            let w = self.queue.pop_back().expect("checked above");
            return self.wait_or_refuse(r, w);
        }
        self.wait_or_refuse(r, w)
    }

    /// A job that cannot start now: queued (prun told its place and why), or refused.
    fn wait_or_refuse(&mut self, r: &Core, w: Waiting) -> Option<u32> {
        let why = match self.fit(r, &w.spec) {
            Fit::Later(why) => why,
            Fit::Now(_) => {
                let n = self.queued();
                let jobs = if n == 1 { "job waits" } else { "jobs wait" };
                format!("it would fit, but {n} earlier {jobs} for slots and the queue is in order")
            }
            Fit::Never(e) => e,
        };
        let (jobid, client) = (w.jobid, w.client);
        let array_started = self.arrays.get(&jobid).is_some_and(|a| w.count() < a.total);
        if w.spec.no_queue && !array_started {
            self.arrays.remove(&jobid);
            let message = format!("job {jobid} does not fit now and --no-queue was given: {why}");
            self.tell(client, event(job_event::Event::Ended(JobEnded { exit_code: 1, message, ..Default::default() })));
            return None;
        }
        if self.queued() + w.count() > MAX_QUEUED {
            self.arrays.remove(&jobid);
            let what = if w.next.is_some() { format!("its {} jobs", w.count()) } else { "this job".to_string() };
            let message = format!(
                "job {jobid} refused: the queue holds {} jobs and {what} would take it past its bound of {MAX_QUEUED}",
                self.queued()
            );
            self.tell(client, event(job_event::Event::Ended(JobEnded { exit_code: 1, message, ..Default::default() })));
            return None;
        }
        self.queue.push_back(w);
        let position = self.queue.len() as u32;
        info!(jobid, position, "job queued: {why}");
        if !array_started {
            // An array that started some elements is under way, not waiting.
            self.tell(client, event(job_event::Event::Queued(JobQueued { jobid, position, reason: why })));
        }
        Some(jobid)
    }

    /// Start what waits at the head of the queue for as long as it fits. A head that can no
    /// longer ever fit (daemons were lost) is refused and the next one tried.
    pub(crate) fn drain_queue(&mut self, r: &Core) {
        while let Some(head) = self.queue.front() {
            match self.fit(r, &head.spec) {
                Fit::Later(_) => return,
                Fit::Never(e) => {
                    let w = self.queue.pop_front().expect("head");
                    self.end_waiting(w, 1, e);
                }
                Fit::Now(p) => self.start_head(r, p),
            }
        }
    }

    /// Start the head of the queue (one element of an array, with a job id of its own) on
    /// `placement`.
    fn start_head(&mut self, r: &Core, placement: Placement) {
        let head = self.queue.front_mut().expect("head");
        let (client, since, attached, mut spec) = (head.client, head.since, head.attached, head.spec.clone());
        let element = head.next.map(|(i, last)| {
            head.next = (i < last).then_some((i + 1, last));
            (head.jobid, i)
        });
        let done = head.next.is_none();
        let own = head.jobid;
        if done {
            self.queue.pop_front();
        }
        let jobid = if element.is_some() { self.new_jobid() } else { own };
        if let Some((_, i)) = element {
            for app in &mut spec.apps {
                app.env.push(format!("{ARRAY_INDEX_VAR}={i}"));
            }
        }
        let (array, index) = element.unzip();
        let started = JobStarted {
            jobid,
            nprocs: placement.nprocs(),
            nodes: placement.num_nodes(),
            index: index.unwrap_or(0),
            array: array.unwrap_or(0),
        };
        self.tell(client, event(job_event::Event::Started(started)));
        if !spec.rankfile.is_empty() {
            // The cpus each line names, on the node's hardware (checked when it was mapped).
            match jobmap::rankfile_cpus(&spec, &Self::candidate_nodes(r), placement.nprocs()) {
                Ok(cpus) => {
                    for e in &mut spec.rankfile {
                        e.cpus = cpus.get(e.rank as usize).map(|c| jobmap::topo::list_text(c)).unwrap_or_default();
                    }
                }
                // A node lost between the check and now: its ranks are placed by the plan.
                Err(e) => warn!(jobid, "rankfile cpus no longer resolve: {e}"),
            }
        }
        no_implicit_binding_on_shared_machines(r, &mut spec, &placement);
        let shown = (spec.display_map || spec.display_allocation || spec.report_bindings).then(|| placement.clone());
        self.note_universe(r);
        self.start_job_as(jobid, &spec, placement, client, None);
        if let Some(p) = shown {
            self.display_start(r, jobid, &spec, &p);
        }
        if let Some(job) = self.jobs.get_mut(&jobid) {
            job.wait_ns = self.now.saturating_sub(since);
            job.array = element;
            job.attached = attached;
        }
    }

    /// A waiting job that will not run: its prun hears why (an array: the summary).
    pub(crate) fn end_waiting(&mut self, w: Waiting, exit_code: i32, message: String) {
        info!(jobid = w.jobid, "queued job leaves the queue: {message}");
        match self.arrays.get_mut(&w.jobid) {
            Some(a) => {
                let left = w.count();
                a.ended += left;
                a.failed += left;
                a.unrun += left;
                if a.first_failure.is_none() {
                    let index = w.next.map_or(0, |(n, _)| n);
                    a.first_failure = Some((index, exit_code, message));
                }
                self.maybe_end_array(w.jobid);
            }
            None => {
                let ended = JobEnded { exit_code, message, jobid: w.jobid, ..Default::default() };
                self.tell(w.client, event(job_event::Event::Ended(ended)));
                self.remember_queued_end(&w, exit_code);
            }
        }
    }

    /// An array element ended: its prun hears it, and the array's summary once all have.
    pub(crate) fn array_element_ended(&mut self, array: u32, index: u32, jobid: u32, code: i32, why: &str) {
        let Some(a) = self.arrays.get_mut(&array) else { return };
        a.ended += 1;
        if code != 0 {
            a.failed += 1;
            if a.first_failure.is_none() {
                a.first_failure = Some((index, code, why.to_string()));
            }
        }
        let client = a.client;
        let ended = JobEnded { exit_code: code, message: why.to_string(), jobid, index, element: true };
        self.tell(client, event(job_event::Event::Ended(ended)));
        self.maybe_end_array(array);
    }

    fn maybe_end_array(&mut self, array: u32) {
        let Some(a) = self.arrays.get(&array) else { return };
        if a.ended < a.total {
            return;
        }
        let a = self.arrays.remove(&array).expect("checked above");
        let (exit_code, message) = match &a.first_failure {
            None => (0, String::new()),
            Some((i, code, why)) => {
                let unrun = if a.unrun > 0 { format!(" ({} never ran)", a.unrun) } else { String::new() };
                let text = format!(
                    "array {array}: {} of {} jobs failed{unrun}; the first, index {i}: {why}",
                    a.failed, a.total
                );
                (*code, text)
            }
        };
        info!(array, total = a.total, failed = a.failed, "array ended");
        let info = JobInfo {
            jobid: array,
            state: "ended".into(),
            exit_code,
            message: message.clone(),
            command: format!("[array of {}] {}", a.total, a.spec.command),
            uid: a.spec.uid,
            ..Default::default()
        };
        self.remember(info, None);
        let ended = JobEnded { exit_code, message, jobid: array, ..Default::default() };
        self.tell(a.client, event(job_event::Event::Ended(ended)));
    }

    /// The queued submissions of `client` leave the queue (its prun went away).
    pub(crate) fn drop_queued_of(&mut self, client: ClientId) {
        let (gone, mut kept): (VecDeque<Waiting>, VecDeque<Waiting>) =
            std::mem::take(&mut self.queue).into_iter().partition(|w| w.client == client && !w.spec.detach);
        for w in kept.iter_mut().filter(|w| w.client == client) {
            // A detached job waits on; whoever attached has left.
            w.attached = false;
        }
        self.queue = kept;
        for w in gone {
            let id = w.jobid;
            self.end_waiting(w, 1, format!("job {id}: prun went away while it was queued"));
        }
    }

    /// The running elements of array `array`.
    pub(crate) fn array_elements(&self, array: u32) -> Vec<u32> {
        self.jobs.iter().filter(|(_, j)| j.array.is_some_and(|(a, _)| a == array)).map(|(id, _)| *id).collect()
    }

    /// Every queued submission ends unrun (the DVM terminates).
    pub(crate) fn end_queued(&mut self, exit_code: i32, why: &str) {
        for w in std::mem::take(&mut self.queue) {
            self.end_waiting(w, exit_code, why.to_string());
        }
    }

    /// Take a queued submission out of the queue.
    pub(crate) fn take_queued(&mut self, jobid: u32) -> Option<Waiting> {
        let i = self.queue.iter().position(|w| w.jobid == jobid)?;
        self.queue.remove(i)
    }
}

/// Open MPI's implicit binding assumes a node owns its cores; daemons sharing one machine would
/// each bind their processes to the same first cores, so there a job asking for nothing (no
/// `--bind-to`, object mapping or PE) is not bound.
pub(crate) fn no_implicit_binding_on_shared_machines(r: &Core, spec: &mut JobSpec, p: &Placement) {
    if spec.bind_to == BindTo::Default as i32 && shares_a_machine(r, p) {
        let plan = jobmap::plan_of(spec, p.nprocs());
        if plan.map_obj.is_none() && plan.pe <= 1 {
            spec.bind_to = BindTo::None as i32;
        }
    }
}

/// Whether a daemon of `p` shares its machine with another daemon of the DVM (fake nodes:
/// namespaces, containers), as their hardware summaries say.
fn shares_a_machine(r: &Core, p: &Placement) -> bool {
    let Some(contacts) = r.contacts() else { return false };
    let machine = |d: u32| r.hardware_of(d).map_or(0, |t| t.machine);
    let mut count: BTreeMap<u64, u32> = BTreeMap::new();
    for &d in contacts.keys() {
        *count.entry(machine(d)).or_insert(0) += 1;
    }
    p.daemons().any(|d| machine(d) != 0 && count[&machine(d)] > 1)
}
