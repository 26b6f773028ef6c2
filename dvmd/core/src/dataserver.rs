//! The DVM's data server (the HNP's): what ranks publish (PMIx_Publish, MPI_Publish_name, and
//! Open MPI's own rendezvous in MPI_Comm_spawn / MPI_Comm_accept), found by lookups from any
//! job. A plain struct: requests in, answers out; the HNP's actor moves the messages and arms
//! the lookup timers.
//!
//! Rules: a key is unique within its range (publishing it again there is refused,
//! `PMIX_ERR_DUPLICATE_KEY`); `PMIX_RANGE_NAMESPACE` data is seen by its own job only, every
//! other range by the whole DVM (one session); `PMIX_PERSIST_FIRST_READ` data is deleted by
//! the lookup that returns it; everything a job published goes when the job ends. A lookup of
//! keys not all published fails at once (`PMIX_ERR_NOT_FOUND`) unless it waits; a waiting
//! lookup is answered when its last key is published, or fails when its timeout fires
//! (`PMIX_ERR_TIMEOUT`) or when its job ends.

use std::collections::BTreeMap;

use dvm_proto::daemon::{DataOp, DataReq, DataResp};
use dvm_proto::pmixworker::{Proc, Published, Value};
use dvm_rml::Rank;

/// `PMIX_RANGE_NAMESPACE`.
const RANGE_NAMESPACE: u32 = 3;
/// `PMIX_PERSIST_FIRST_READ`.
const PERSIST_FIRST_READ: u32 = 1;

#[derive(Debug, Clone)]
struct Entry {
    jobid: u32,
    proc: Proc,
    value: Value,
    /// Some(job): seen by that job only.
    scope: Option<u32>,
    first_read: bool,
}

/// A lookup waiting for keys to be published.
#[derive(Debug, Clone)]
struct Waiting {
    daemon: Rank,
    req: DataReq,
}

/// An answer to send: to `daemon`, `resp`.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub daemon: Rank,
    pub resp: DataResp,
}

/// What a request asks of the HNP besides the answers.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    pub answers: Vec<Answer>,
    /// Arm a timer for this waiting lookup (token, seconds); `on_timeout(token)` when it fires.
    pub timer: Option<(u64, u32)>,
    /// (looking job, publishing job) for each rendezvous lookup answered across jobs: Open MPI
    /// 4.1's connect/accept exchanges each side's participants under `<port>:connect` and
    /// `<port>:accept`, so these two jobs are about to be connected (libpmix completes a
    /// connect with every participant on one daemon without telling the host).
    pub joined: Vec<(u32, u32)>,
}

/// An Open MPI connect/accept rendezvous key.
fn is_rendezvous(key: &str) -> bool {
    key.ends_with(":connect") || key.ends_with(":accept")
}

#[derive(Debug, Default)]
pub struct DataServer {
    entries: Vec<Entry>,
    waiting: BTreeMap<u64, Waiting>,
    next_token: u64,
}

fn resp(id: u64, status: i32, found: Vec<Published>) -> DataResp {
    DataResp { id, status, found }
}

impl DataServer {
    /// Entries held (for tests and leak checks).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Lookups waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn visible(e: &Entry, jobid: u32) -> bool {
        e.scope.is_none_or(|j| j == jobid)
    }

    /// A request from a rank of `req.jobid`, relayed by `daemon`.
    pub fn handle(&mut self, daemon: Rank, req: DataReq) -> Outcome {
        let op = DataOp::try_from(req.op).unwrap_or(DataOp::DataLookup);
        match op {
            DataOp::DataPublish => self.publish(daemon, req),
            DataOp::DataLookup => self.lookup(daemon, req),
            DataOp::DataUnpublish => {
                let proc = req.proc.clone().unwrap_or_default();
                self.entries.retain(|e| !(e.proc == proc && (req.keys.is_empty() || req.keys.contains(&e.value.key))));
                Outcome { answers: vec![Answer { daemon, resp: resp(req.id, 0, Vec::new()) }], ..Default::default() }
            }
        }
    }

    fn publish(&mut self, daemon: Rank, req: DataReq) -> Outcome {
        let scope = (req.range == RANGE_NAMESPACE).then_some(req.jobid);
        let proc = req.proc.clone().unwrap_or_default();
        for v in &req.values {
            let clash = self.entries.iter().any(|e| e.value.key == v.key && (e.scope.is_none() || e.scope == scope));
            if clash || req.values.iter().filter(|o| o.key == v.key).count() > 1 {
                let answer = Answer { daemon, resp: resp(req.id, crate::pmixdef::ERR_DUPLICATE_KEY, Vec::new()) };
                return Outcome { answers: vec![answer], timer: None, joined: Vec::new() };
            }
        }
        for v in req.values {
            self.entries.push(Entry {
                jobid: req.jobid,
                proc: proc.clone(),
                value: v,
                scope,
                first_read: req.persistence == PERSIST_FIRST_READ,
            });
        }
        let mut answers = vec![Answer { daemon, resp: resp(req.id, 0, Vec::new()) }];
        let mut joined = Vec::new();
        // Waiting lookups that are now complete, oldest first.
        let tokens: Vec<u64> = self.waiting.keys().copied().collect();
        for t in tokens {
            let req = self.waiting[&t].req.clone();
            if let Some(found) = self.take(&req, &mut joined) {
                let w = self.waiting.remove(&t).expect("present");
                answers.push(Answer { daemon: w.daemon, resp: resp(w.req.id, 0, found) });
            }
        }
        Outcome { answers, timer: None, joined }
    }

    /// Every key of `req` visible to its job, or None; first-read entries found are removed.
    /// Rendezvous lookups across jobs are recorded in `joined`.
    fn take(&mut self, req: &DataReq, joined: &mut Vec<(u32, u32)>) -> Option<Vec<Published>> {
        let mut idx = Vec::with_capacity(req.keys.len());
        for k in &req.keys {
            let i = self.entries.iter().position(|e| e.value.key == *k && Self::visible(e, req.jobid))?;
            idx.push(i);
        }
        for &i in &idx {
            let e = &self.entries[i];
            if e.jobid != req.jobid && is_rendezvous(&e.value.key) {
                joined.push((req.jobid, e.jobid));
            }
        }
        let found = idx
            .iter()
            .map(|&i| Published {
                proc: Some(self.entries[i].proc.clone()),
                value: Some(self.entries[i].value.clone()),
            })
            .collect();
        idx.sort_unstable();
        idx.dedup();
        for &i in idx.iter().rev() {
            if self.entries[i].first_read {
                self.entries.remove(i);
            }
        }
        Some(found)
    }

    fn lookup(&mut self, daemon: Rank, req: DataReq) -> Outcome {
        if req.keys.is_empty() {
            let answer = Answer { daemon, resp: resp(req.id, crate::pmixdef::ERR_BAD_PARAM, Vec::new()) };
            return Outcome { answers: vec![answer], timer: None, joined: Vec::new() };
        }
        let mut joined = Vec::new();
        if let Some(found) = self.take(&req, &mut joined) {
            return Outcome { answers: vec![Answer { daemon, resp: resp(req.id, 0, found) }], timer: None, joined };
        }
        if !req.wait {
            let answer = Answer { daemon, resp: resp(req.id, crate::pmixdef::ERR_NOT_FOUND, Vec::new()) };
            return Outcome { answers: vec![answer], timer: None, joined: Vec::new() };
        }
        self.next_token += 1;
        let token = self.next_token;
        let timer = (req.timeout_s > 0).then_some((token, req.timeout_s));
        self.waiting.insert(token, Waiting { daemon, req });
        Outcome { answers: Vec::new(), timer, joined: Vec::new() }
    }

    /// A waiting lookup's timeout fired (nothing if it was answered meanwhile).
    pub fn on_timeout(&mut self, token: u64) -> Option<Answer> {
        let w = self.waiting.remove(&token)?;
        Some(Answer { daemon: w.daemon, resp: resp(w.req.id, crate::pmixdef::ERR_TIMEOUT, Vec::new()) })
    }

    /// A job ended: its data goes, its waiting lookups fail.
    pub fn job_ended(&mut self, jobid: u32) -> Vec<Answer> {
        self.entries.retain(|e| e.jobid != jobid);
        let gone: Vec<u64> = self.waiting.iter().filter(|(_, w)| w.req.jobid == jobid).map(|(t, _)| *t).collect();
        gone.into_iter()
            .filter_map(|t| self.waiting.remove(&t))
            .map(|w| Answer { daemon: w.daemon, resp: resp(w.req.id, crate::pmixdef::ERR_NOT_FOUND, Vec::new()) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(k: &str, s: &str) -> Value {
        Value { key: k.into(), kind: 1, str: s.into(), ..Default::default() }
    }
    fn proc(job: u32) -> Option<Proc> {
        Some(Proc { nspace: format!("ns{job}"), rank: 0 })
    }
    fn publish(id: u64, job: u32, values: Vec<Value>, range: u32, persistence: u32) -> DataReq {
        DataReq {
            id,
            op: DataOp::DataPublish as i32,
            jobid: job,
            proc: proc(job),
            values,
            range,
            persistence,
            ..Default::default()
        }
    }
    fn lookup(id: u64, job: u32, keys: &[&str], wait: bool, timeout_s: u32) -> DataReq {
        DataReq {
            id,
            op: DataOp::DataLookup as i32,
            jobid: job,
            proc: proc(job),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            wait,
            timeout_s,
            ..Default::default()
        }
    }
    fn status(o: &Outcome, i: usize) -> i32 {
        o.answers[i].resp.status
    }

    #[test]
    fn publish_then_lookup_across_jobs() {
        let mut ds = DataServer::default();
        assert_eq!(status(&ds.handle(1, publish(1, 7, vec![val("svc", "port-a")], 0, 0)), 0), 0);
        let o = ds.handle(2, lookup(2, 8, &["svc"], false, 0));
        assert_eq!((o.answers[0].daemon, status(&o, 0)), (2, 0));
        assert_eq!(o.answers[0].resp.found[0].value.as_ref().unwrap().str, "port-a");
        assert_eq!(o.answers[0].resp.found[0].proc, proc(7));
        // Still there (persistent until its job ends), and a second publish of it is refused.
        assert_eq!(status(&ds.handle(2, lookup(3, 8, &["svc"], false, 0)), 0), 0);
        assert_eq!(
            status(&ds.handle(1, publish(4, 9, vec![val("svc", "x")], 0, 0)), 0),
            crate::pmixdef::ERR_DUPLICATE_KEY
        );
        assert!(ds.job_ended(7).is_empty());
        assert_eq!(status(&ds.handle(2, lookup(5, 8, &["svc"], false, 0)), 0), crate::pmixdef::ERR_NOT_FOUND);
        assert!(ds.is_empty());
    }

    #[test]
    fn waiting_lookup_is_answered_by_the_publish_or_times_out() {
        let mut ds = DataServer::default();
        let o = ds.handle(3, lookup(1, 5, &["a", "b"], true, 600));
        assert!(o.answers.is_empty());
        let (token, secs) = o.timer.unwrap();
        assert_eq!(secs, 600);
        let o = ds.handle(1, publish(2, 6, vec![val("a", "1")], 0, 0));
        assert_eq!(o.answers.len(), 1, "only the publish's own answer: b is missing");
        let o = ds.handle(1, publish(3, 6, vec![val("b", "2")], 0, PERSIST_FIRST_READ));
        assert_eq!(o.answers.len(), 2);
        assert_eq!((o.answers[1].daemon, o.answers[1].resp.id), (3, 1));
        assert_eq!(o.answers[1].resp.found.len(), 2);
        assert_eq!(ds.len(), 1, "the first-read entry went with the lookup that read it");
        assert!(ds.on_timeout(token).is_none(), "already answered");
        let o = ds.handle(3, lookup(4, 5, &["zz"], true, 1));
        let (token, _) = o.timer.unwrap();
        let a = ds.on_timeout(token).unwrap();
        assert_eq!((a.resp.id, a.resp.status), (4, crate::pmixdef::ERR_TIMEOUT));
        assert_eq!(ds.waiting(), 0);
    }

    #[test]
    fn rendezvous_lookups_across_jobs_join_them() {
        let mut ds = DataServer::default();
        let o = ds.handle(1, lookup(1, 5, &["p:1:accept"], true, 600));
        assert!(o.joined.is_empty());
        let o = ds.handle(2, publish(2, 6, vec![val("p:1:accept", "6:0")], 0, PERSIST_FIRST_READ));
        assert_eq!(o.joined, vec![(5, 6)], "job 5 found job 6's side of the rendezvous");
        ds.handle(2, publish(3, 6, vec![val("svc", "p:1")], 0, 0));
        assert!(ds.handle(1, lookup(4, 5, &["svc"], false, 0)).joined.is_empty(), "a plain name joins nobody");
        ds.handle(2, publish(5, 6, vec![val("q:connect", "x")], 0, 0));
        assert!(ds.handle(1, lookup(6, 6, &["q:connect"], false, 0)).joined.is_empty(), "within one job");
    }

    #[test]
    fn namespace_range_is_private_and_job_end_fails_its_waiters() {
        let mut ds = DataServer::default();
        ds.handle(1, publish(1, 5, vec![val("k", "v")], RANGE_NAMESPACE, 0));
        assert_eq!(status(&ds.handle(1, lookup(2, 6, &["k"], false, 0)), 0), crate::pmixdef::ERR_NOT_FOUND);
        assert_eq!(status(&ds.handle(1, lookup(3, 5, &["k"], false, 0)), 0), 0);
        // The same key in another job's private range does not clash.
        assert_eq!(status(&ds.handle(1, publish(4, 6, vec![val("k", "w")], RANGE_NAMESPACE, 0)), 0), 0);
        ds.handle(2, lookup(5, 9, &["never"], true, 0));
        let a = ds.job_ended(9);
        assert_eq!((a.len(), a[0].daemon, a[0].resp.status), (1, 2, crate::pmixdef::ERR_NOT_FOUND));
        // Unpublish of everything a proc published.
        let un = DataReq { id: 6, op: DataOp::DataUnpublish as i32, jobid: 5, proc: proc(5), ..Default::default() };
        ds.handle(1, un);
        assert_eq!(ds.len(), 1);
    }
}
