//! `MPI_Comm_spawn` under the MPICH family: PMI-1's `mcmd=spawn` blocks (one per command of
//! a spawn-multiple, answered once the last has come) and PMI-2's `spawn`, turned into the
//! DVM's spawn (the HNP maps and starts the child job, as for a PMIx spawn). The child's kvs
//! starts with the parent's pre-put keys (`PARENT_ROOT_PORT_NAME`, by which the children call
//! their parent back) and its ranks get `PMI_SPAWNED=1`.
//!
//! Never: maps or starts anything itself. Do not break: the spawning rank is answered once,
//! after every child proc started or the spawn failed.

use dvm_proto::daemon::{daemon_cmd, SpawnReq, SpawnResp};
use dvm_proto::job::{AppContext, MapBy};
use tracing::info;

use super::wire::{Form, Request};
use super::{Pmi, PmiOut, ID_BIT};
use crate::Input;

/// A spawn asked of the HNP, waiting for its answer.
#[derive(Debug)]
pub(super) struct SpawnAsk {
    pub jobid: u32,
    rank: u32,
    form: Form,
}

/// What one spawn asks for, read from its request(s).
#[derive(Debug, Default, PartialEq)]
pub(super) struct SpawnPlan {
    pub apps: Vec<AppContext>,
    pub preput: Vec<String>,
}

/// PMI-1: the blocks of one spawn (each one command), in order.
pub(super) fn plan_v1(blocks: &[Request], cwd: &str) -> Result<SpawnPlan, String> {
    let mut plan = SpawnPlan::default();
    for (i, b) in blocks.iter().enumerate() {
        let num = |k: &str| b.get(k).map(|v| v.parse::<u32>().map_err(|_| format!("spawn {k}={v} is not a number")));
        let np = num("nprocs").ok_or("a spawn without nprocs")??;
        let exe = b.get("execname").filter(|e| !e.is_empty()).ok_or("a spawn without execname")?;
        let argc = num("argcnt").transpose()?.unwrap_or(0);
        let mut argv = vec![exe.to_owned()];
        for a in 1..=argc {
            argv.push(b.get(&format!("arg{a}")).ok_or(format!("spawn arg{a} of {argc} is missing"))?.to_owned());
        }
        let wdir = info_of(b, "info_num", "info_key_", "info_val_")?.into_iter().find(|(k, _)| k == "wdir");
        let wdir = wdir.map_or_else(|| cwd.to_owned(), |(_, v)| v);
        if i == 0 {
            let pre = info_of(b, "preput_num", "preput_key_", "preput_val_")?;
            plan.preput = pre.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        }
        plan.apps.push(AppContext { argv, np, env: Vec::new(), wdir, preload_binary: false });
    }
    Ok(plan)
}

/// PMI-2: `ncmds`, the pre-put pairs, then per command `subcmd`, `maxprocs`, `argc`,
/// `argvN`, `infokeycount`, `infokeyN`/`infovalN`, in the order sent.
pub(super) fn plan_v2(req: &Request, cwd: &str) -> Result<SpawnPlan, String> {
    let mut plan = SpawnPlan::default();
    let mut pre: Vec<(String, String)> = Vec::new();
    let mut info_keys: Vec<String> = Vec::new();
    for (k, v) in &req.args {
        let app = plan.apps.last_mut();
        match (k.as_str(), app) {
            ("subcmd", _) => {
                plan.apps.push(AppContext { argv: vec![v.clone()], wdir: cwd.to_owned(), ..Default::default() })
            }
            ("maxprocs", Some(a)) => a.np = v.parse().map_err(|_| format!("spawn maxprocs={v} is not a number"))?,
            (k, Some(a)) if k.starts_with("argv") => a.argv.push(v.clone()),
            (k, Some(_)) if k.starts_with("infokey") && k != "infokeycount" => info_keys.push(v.clone()),
            (k, Some(a)) if k.starts_with("infoval") && info_keys.last().is_some_and(|key| key == "wdir") => {
                a.wdir = v.clone()
            }
            (k, _) if k.starts_with("ppkey") => pre.push((v.clone(), String::new())),
            (k, _) if k.starts_with("ppval") => {
                let last = pre.last_mut().ok_or("a spawn ppval before its ppkey")?;
                last.1 = v.clone();
            }
            _ => {}
        }
    }
    plan.preput = pre.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(plan)
}

/// `info_num` pairs of a PMI-1 block.
fn info_of(b: &Request, count: &str, key: &str, val: &str) -> Result<Vec<(String, String)>, String> {
    let n: u32 = b.get(count).map_or(Ok(0), |v| v.parse().map_err(|_| format!("spawn {count}={v} is not a number")))?;
    (0..n)
        .map(|i| {
            let k = b.get(&format!("{key}{i}")).ok_or(format!("spawn {key}{i} is missing"))?;
            Ok((k.to_owned(), b.get(&format!("{val}{i}")).unwrap_or("").to_owned()))
        })
        .collect()
}

impl Pmi {
    /// A PMI-1 spawn block, or PMI-2's spawn: once whole, asked of the HNP.
    pub(super) fn spawn(&mut self, jobid: u32, rank: u32, req: Request) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        let cwd = job.start.cwd.clone();
        let mpi = job.start.mpi;
        let app = job.start.placement.app_of(rank).unwrap_or(0) as usize;
        let env = job.start.app_env.get(app).cloned().unwrap_or_default();
        let Some(conn) = job.conns.get_mut(&rank) else { return };
        let form = req.form;
        let plan = match form {
            Form::V1 => {
                let total = req.get("totspawns").and_then(|t| t.parse::<usize>().ok()).unwrap_or(1);
                conn.spawn_blocks.push(req);
                if conn.spawn_blocks.len() < total {
                    return;
                }
                plan_v1(&std::mem::take(&mut conn.spawn_blocks), &cwd)
            }
            Form::V2 => plan_v2(&req, &cwd),
        };
        let mut plan = match plan {
            Ok(p) if !p.apps.is_empty() && p.apps.iter().all(|a| a.np > 0) => p,
            Ok(_) => return self.fault(jobid, rank, "sent a PMI spawn of no process"),
            Err(e) => return self.fault(jobid, rank, &format!("sent a malformed PMI spawn: {e}")),
        };
        for a in &mut plan.apps {
            a.env = env.clone();
        }
        let id = ID_BIT | self.next_key;
        self.next_key += 1;
        self.spawns.insert(id, SpawnAsk { jobid, rank, form });
        info!(jobid, rank, apps = plan.apps.len(), "PMI spawn asked of the HNP");
        let req = SpawnReq {
            id,
            jobid,
            rank,
            apps: plan.apps,
            map_by: MapBy::Slot as i32,
            mpi: mpi as i32,
            pmi_preput: plan.preput,
            ..Default::default()
        };
        self.out.push(PmiOut::Router(Input::Cmd { dst: 0, body: daemon_cmd::Body::SpawnReq(req) }));
    }

    /// The HNP's answer to a spawn: the spawning rank goes on (or learns why not).
    pub fn on_spawn_resp(&mut self, resp: SpawnResp) {
        let Some(a) = self.spawns.remove(&resp.id) else { return };
        let rc = if resp.status == 0 { "0" } else { "-1" };
        let err = resp.error.replace(' ', "_");
        match a.form {
            Form::V1 if resp.status == 0 => self.answer(a.jobid, a.rank, a.form, "spawn_result", &[("rc", rc)]),
            Form::V1 => self.answer(a.jobid, a.rank, a.form, "spawn_result", &[("rc", rc), ("errmsg", &err)]),
            Form::V2 => {
                let args = [("rc", rc), ("jobid", resp.nspace.as_str()), ("nerrs", "0"), ("errmsg", &resp.error)];
                self.answer(a.jobid, a.rank, a.form, "spawn-response", &args)
            }
        }
    }
}
