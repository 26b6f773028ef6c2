//! One request of a rank, answered: PMI-1 commands and their PMI-2 counterparts.
//!
//! Never: an answer for a request that waits (a barrier, a node attribute not put yet): those
//! are answered when what they wait for comes. Do not break: an unknown command, a second
//! `init`, a request before `init` or after `finalize`, or a key or value past the limits we
//! announced fails the job, naming the rank.

use dvm_proto::daemon::{daemon_cmd, DataOp, DataReq, DataResp, JobAbort};
use dvm_proto::pmixworker as pw;
use tracing::debug;

use super::wire::{Form, Request, KEYLEN_MAX, KVSNAME_MAX, VALLEN_MAX};
use super::{Pmi, PmiOut, ID_BIT};
use crate::Input;

/// The PMI versions served: PMI-1.1 and PMI-2.0.
const VERSIONS: [(u32, u32); 2] = [(1, 1), (2, 0)];

impl Pmi {
    pub(super) fn serve(&mut self, jobid: u32, rank: u32, req: Request) {
        debug!(jobid, rank, cmd = %req.cmd, "PMI request");
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        let Some(conn) = job.conns.get_mut(&rank) else { return };
        let f = req.form;
        let first = matches!(req.cmd.as_str(), "init" | "fullinit");
        if !first && !conn.inited {
            return self.fault(jobid, rank, &format!("sent PMI command '{}' before init", req.cmd));
        }
        if conn.finalized && req.cmd != "abort" {
            return self.fault(jobid, rank, &format!("sent PMI command '{}' after finalize", req.cmd));
        }
        if let (true, Some(why)) = (first, job.start.refuse.clone()) {
            return self.fault(jobid, rank, &why);
        }
        let (nprocs, universe) = (job.start.placement.nprocs(), job.start.universe);
        let appnum = job.start.placement.app_of(rank).unwrap_or(0).to_string();
        let kvsname = job.start.kvsname.clone();
        match (f, req.cmd.as_str()) {
            (Form::V1, "init") => {
                if conn.greeted {
                    return self.fault(jobid, rank, "sent a second PMI init");
                }
                let num = |k: &str| req.get(k).and_then(|v| v.parse::<u32>().ok());
                let (v, s) = (num("pmi_version").unwrap_or(0), num("pmi_subversion").unwrap_or(0));
                let Some(&(v, sub)) = VERSIONS.iter().find(|(ver, _)| *ver == v) else {
                    let text = format!("asked for PMI version {v}.{s}; this daemon serves PMI-1 and PMI-2");
                    return self.fault(jobid, rank, &text);
                };
                // A PMI-2 client says `fullinit` next; a PMI-1 client is served from now.
                conn.greeted = true;
                conn.inited = v == 1;
                let (v, sub) = (v.to_string(), sub.to_string());
                self.answer(
                    jobid,
                    rank,
                    f,
                    "response_to_init",
                    &[("pmi_version", &v), ("pmi_subversion", &sub), ("rc", "0")],
                );
            }
            (Form::V2, "fullinit") => {
                if conn.inited {
                    return self.fault(jobid, rank, "sent a second PMI init");
                }
                if let Some(r) = req.get("pmirank").filter(|r| *r != rank.to_string()) {
                    return self.fault(jobid, rank, &format!("said it is rank {r} in PMI fullinit"));
                }
                conn.inited = true;
                let (r, n) = (rank.to_string(), nprocs.to_string());
                let args = [
                    ("pmi-version", "2"),
                    ("pmi-subversion", "0"),
                    ("rank", r.as_str()),
                    ("size", n.as_str()),
                    ("appnum", appnum.as_str()),
                    ("spawner-jobid", ""),
                    ("debugged", "FALSE"),
                    ("pmiverbose", "FALSE"),
                    ("rc", "0"),
                ];
                self.answer(jobid, rank, f, "fullinit-response", &args);
            }
            (_, "init" | "fullinit") => {
                self.fault(jobid, rank, &format!("sent PMI command '{}' in the wrong form", req.cmd))
            }
            (Form::V1, "get_maxes") => {
                let (a, b, c) = (KVSNAME_MAX.to_string(), KEYLEN_MAX.to_string(), VALLEN_MAX.to_string());
                let args =
                    [("kvsname_max", a.as_str()), ("keylen_max", b.as_str()), ("vallen_max", c.as_str()), ("rc", "0")];
                self.answer(jobid, rank, f, "maxes", &args);
            }
            (Form::V1, "get_appnum") => self.answer(jobid, rank, f, "appnum", &[("appnum", &appnum), ("rc", "0")]),
            (Form::V1, "get_my_kvsname") => {
                self.answer(jobid, rank, f, "my_kvsname", &[("kvsname", &kvsname), ("rc", "0")])
            }
            (Form::V2, "job-getid") => {
                self.answer(jobid, rank, f, "job-getid-response", &[("jobid", &kvsname), ("rc", "0")])
            }
            (Form::V1, "get_universe_size") => {
                self.answer(jobid, rank, f, "universe_size", &[("size", &universe.to_string()), ("rc", "0")])
            }
            (Form::V1, "put") | (Form::V2, "kvs-put") => self.put(jobid, rank, &req),
            (Form::V1, "get") | (Form::V2, "kvs-get") | (Form::V2, "info-getjobattr") => self.get(jobid, rank, &req),
            (Form::V1, "barrier_in") | (Form::V2, "kvs-fence") => self.enter_barrier(jobid, rank, f),
            (Form::V2, "info-putnodeattr") => self.put_node_attr(jobid, rank, &req),
            (Form::V2, "info-getnodeattr") => self.get_node_attr(jobid, rank, &req),
            (Form::V1, "finalize") | (Form::V2, "finalize") => {
                conn.finalized = true;
                let cmd = if f == Form::V1 { "finalize_ack" } else { "finalize-response" };
                self.answer(jobid, rank, f, cmd, &[("rc", "0")]);
            }
            (_, "abort") => self.abort(jobid, rank, &req),
            (_, "spawn") => self.spawn(jobid, rank, req),
            (Form::V1, "publish_name") | (Form::V2, "name-publish") => {
                self.name(jobid, rank, &req, DataOp::DataPublish)
            }
            (Form::V1, "lookup_name") | (Form::V2, "name-lookup") => self.name(jobid, rank, &req, DataOp::DataLookup),
            (Form::V1, "unpublish_name") | (Form::V2, "name-unpublish") => {
                self.name(jobid, rank, &req, DataOp::DataUnpublish)
            }
            (_, other) => {
                let text = format!("sent an unknown PMI command '{other}'");
                self.fault(jobid, rank, &text)
            }
        }
    }

    /// A put's key and value, within the limits announced; else the job fails, naming `what`.
    fn key_value(&mut self, jobid: u32, rank: u32, req: &Request, what: &str) -> Option<(String, String)> {
        let (Some(key), Some(value)) = (req.get("key"), req.get("value")) else {
            self.fault(jobid, rank, &format!("sent a PMI {what} without a key or value"));
            return None;
        };
        if let Some(fault) = limits(key, value) {
            self.fault(jobid, rank, &fault);
            return None;
        }
        Some((key.to_owned(), value.to_owned()))
    }

    fn put(&mut self, jobid: u32, rank: u32, req: &Request) {
        let Some((key, value)) = self.key_value(jobid, rank, req, "put") else { return };
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        job.kvs.insert(key.clone(), value.clone());
        job.pending.push((key, value));
        match req.form {
            Form::V1 => self.answer(jobid, rank, Form::V1, "put_result", &[("rc", "0"), ("msg", "success")]),
            Form::V2 => self.answer(jobid, rank, Form::V2, "kvs-put-response", &[("rc", "0")]),
        }
    }

    fn get(&mut self, jobid: u32, rank: u32, req: &Request) {
        let Some(key) = req.get("key") else { return self.fault(jobid, rank, "sent a PMI get without a key") };
        let Some(job) = self.jobs.get(&jobid) else { return };
        let value = job.kvs.get(key).cloned();
        let f = req.form;
        match (f, value) {
            (Form::V1, Some(v)) => {
                self.answer(jobid, rank, f, "get_result", &[("rc", "0"), ("msg", "success"), ("value", &v)])
            }
            (Form::V1, None) => {
                let msg = format!("key_{key}_not_found");
                self.answer(jobid, rank, f, "get_result", &[("rc", "-1"), ("msg", &msg)])
            }
            (Form::V2, v) => {
                let cmd = if req.cmd == "kvs-get" { "kvs-get-response" } else { "info-getjobattr-response" };
                let found = if v.is_some() { "TRUE" } else { "FALSE" };
                let v = v.unwrap_or_default();
                self.answer(jobid, rank, f, cmd, &[("found", found), ("value", &v), ("rc", "0")])
            }
        }
    }

    fn put_node_attr(&mut self, jobid: u32, rank: u32, req: &Request) {
        let Some((key, value)) = self.key_value(jobid, rank, req, "node attribute") else { return };
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        job.node_attrs.insert(key.clone(), value.clone());
        // Gets that waited for this key go on.
        let mut woken = Vec::new();
        for (&r, c) in job.conns.iter_mut() {
            c.node_waits.retain(|(k, form)| {
                let hit = *k == key;
                if hit {
                    woken.push((r, *form));
                }
                !hit
            });
        }
        self.answer(jobid, rank, Form::V2, "info-putnodeattr-response", &[("rc", "0")]);
        for (r, form) in woken {
            self.answer(
                jobid,
                r,
                form,
                "info-getnodeattr-response",
                &[("found", "TRUE"), ("value", &value), ("rc", "0")],
            );
        }
    }

    fn get_node_attr(&mut self, jobid: u32, rank: u32, req: &Request) {
        let Some(key) = req.get("key") else {
            return self.fault(jobid, rank, "sent a PMI node attribute get without a key");
        };
        let wait = req.get("wait").is_some_and(|w| w.eq_ignore_ascii_case("TRUE"));
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        match job.node_attrs.get(key).cloned() {
            Some(v) => self.answer(
                jobid,
                rank,
                Form::V2,
                "info-getnodeattr-response",
                &[("found", "TRUE"), ("value", &v), ("rc", "0")],
            ),
            None if wait => {
                if let Some(c) = job.conns.get_mut(&rank) {
                    c.node_waits.push((key.to_owned(), Form::V2));
                }
            }
            None => self.answer(jobid, rank, Form::V2, "info-getnodeattr-response", &[("found", "FALSE"), ("rc", "0")]),
        }
    }

    /// `abort`: the job fails with the rank's code and message, at once.
    fn abort(&mut self, jobid: u32, rank: u32, req: &Request) {
        let code = req.get("exitcode").or_else(|| req.get("code")).and_then(|c| c.parse::<i32>().ok()).unwrap_or(1);
        let message = req.get("msg").or_else(|| req.get("message")).unwrap_or("").to_owned();
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        if let Some(c) = job.conns.get_mut(&rank) {
            c.finalized = true;
        }
        // The MPICH family's client waits in its abort for an answer its launcher never sends
        // (Hydra kills the job): the HNP ends the job at once.
        let abort = JobAbort { jobid, rank, code, message, daemon: self.me, kill: true };
        self.out.push(PmiOut::Router(Input::Cmd { dst: 0, body: daemon_cmd::Body::JobAbort(abort) }));
    }
}

/// A name service request waiting for the data server.
#[derive(Debug)]
pub(super) struct NameAsk {
    pub jobid: u32,
    rank: u32,
    form: Form,
    op: DataOp,
}

impl Pmi {
    /// `publish_name`, `lookup_name`, `unpublish_name` (and PMI-2's `name-*`): asked of the
    /// HNP's data server, the one PMIx's publish and lookup use, in the DVM's session range.
    fn name(&mut self, jobid: u32, rank: u32, req: &Request, op: DataOp) {
        let service = req.get("service").or_else(|| req.get("name"));
        let Some(service) = service.filter(|s| !s.is_empty()) else {
            return self.fault(jobid, rank, &format!("sent PMI command '{}' without a service name", req.cmd));
        };
        let Some(job) = self.jobs.get(&jobid) else { return };
        let proc = pw::Proc { nspace: job.start.kvsname.clone(), rank };
        let (mut values, mut keys) = (Vec::new(), Vec::new());
        if op == DataOp::DataPublish {
            let Some(port) = req.get("port") else {
                return self.fault(jobid, rank, "sent a PMI publish without a port");
            };
            let kind = crate::pmixdef::kind::STRING;
            values.push(pw::Value { key: service.to_owned(), kind, str: port.to_owned(), ..Default::default() });
        } else {
            keys.push(service.to_owned());
        }
        let id = ID_BIT | self.next_key;
        self.next_key += 1;
        self.names.insert(id, NameAsk { jobid, rank, form: req.form, op });
        let ask = DataReq { id, op: op as i32, jobid, proc: Some(proc), values, keys, ..Default::default() };
        self.out.push(PmiOut::Router(Input::Cmd { dst: 0, body: daemon_cmd::Body::DataReq(ask) }));
    }

    /// The data server's answer to a name service request.
    pub fn on_data_resp(&mut self, resp: DataResp) {
        let Some(a) = self.names.remove(&resp.id) else { return };
        let ok = resp.status == crate::pmixdef::SUCCESS;
        let port = resp.found.first().and_then(|p| p.value.as_ref()).map(|v| v.str.clone());
        let (rc, info) = if ok { ("0", "ok") } else { ("1", "not_found") };
        let (f, j, r) = (a.form, a.jobid, a.rank);
        match (f, a.op) {
            (Form::V1, DataOp::DataPublish) => self.answer(j, r, f, "publish_result", &[("rc", rc), ("info", info)]),
            (Form::V1, DataOp::DataUnpublish) => {
                self.answer(j, r, f, "unpublish_result", &[("rc", rc), ("info", info)])
            }
            (Form::V1, DataOp::DataLookup) => match port.filter(|_| ok) {
                Some(p) => self.answer(j, r, f, "lookup_result", &[("rc", "0"), ("info", "ok"), ("port", &p)]),
                None => self.answer(j, r, f, "lookup_result", &[("rc", "1"), ("info", "not_found")]),
            },
            (Form::V2, DataOp::DataPublish) => self.answer(j, r, f, "name-publish-response", &[("rc", rc)]),
            (Form::V2, DataOp::DataUnpublish) => self.answer(j, r, f, "name-unpublish-response", &[("rc", rc)]),
            (Form::V2, DataOp::DataLookup) => match port.filter(|_| ok) {
                Some(p) => {
                    self.answer(j, r, f, "name-lookup-response", &[("value", &p), ("found", "TRUE"), ("rc", "0")])
                }
                None => self.answer(j, r, f, "name-lookup-response", &[("found", "FALSE"), ("rc", "1")]),
            },
        }
    }
}

/// What is wrong with a key and value, measured against the maxima announced.
fn limits(key: &str, value: &str) -> Option<String> {
    if key.is_empty() || key.len() > KEYLEN_MAX {
        return Some(format!("put a PMI key of {} bytes (1 to {KEYLEN_MAX} allowed)", key.len()));
    }
    if value.len() > VALLEN_MAX {
        return Some(format!("put a PMI value of {} bytes for key '{key}' ({VALLEN_MAX} allowed)", value.len()));
    }
    None
}
