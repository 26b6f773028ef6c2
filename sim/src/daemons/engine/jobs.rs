//! The prun workload: jobs submitted to the HNP, their simulated procs' events fed back to the
//! daemons that started them, and what each prun heard.

use dvm_core::jobs::{ClientId, ProcEvent};
use dvm_core::node::Control;
use dvm_core::stage::{SourceFile, StagePlan};
use dvm_grpcomm::Rank;

use super::shell::In;
use super::{CoreEngine, Kind, State, STAGE_TOKEN};

/// The client id of launch `idx`.
fn client(idx: usize) -> ClientId {
    ClientId(idx as u64 + 1)
}

impl CoreEngine<'_> {
    pub(super) fn launch(&mut self, idx: usize) {
        match self.nodes[0].state {
            State::Running => {
                self.trace.launched_at[idx] = Some(self.q.now());
                self.q.note(|| format!("d0 LAUNCH {idx}"));
                let spec = self.sc.launches[idx].spec.clone();
                self.drive_in(0, In::Control(0, Control::Launch(spec, client(idx))));
            }
            State::Stopped => self.nodes[0].deferred.push(Kind::Launch { idx }),
            State::Dead { .. } => {}
        }
    }

    /// Daemons the HNP holds alive whose disk has any part of staged file `idx`.
    pub(super) fn holding_stage(&self, idx: usize) -> Vec<Rank> {
        let topo = self.nodes[0].node.router().topology();
        let name = format!("/stage{idx}");
        (0..self.nodes.len() as Rank)
            .filter(|&r| topo.is_alive(r) && self.nodes[r as usize].shell.disk.holds(|p| p.ends_with(&name)))
            .collect()
    }

    /// Stage file `idx` from the HNP's node to every daemon.
    pub(super) fn stage(&mut self, idx: usize) {
        match self.nodes[0].state {
            State::Running => {
                let st = &self.sc.stages[idx];
                let src = format!("/sim/stage{idx}");
                self.nodes[0].shell.disk.sources.insert(src.clone(), st.bytes.clone());
                let file = SourceFile {
                    src,
                    dest: format!("/scratch/%n/stage{idx}"),
                    size: st.bytes.len() as u64,
                    mode: 0o644,
                };
                let plan = StagePlan {
                    files: vec![file],
                    hosts: Vec::new(),
                    compress: false,
                    segment: st.segment,
                    window: st.window,
                    uid: 0,
                };
                self.trace.stage_starts[idx] = Some(self.q.now());
                self.q.note(|| format!("d0 STAGE {idx}"));
                self.drive_in(0, In::Control(STAGE_TOKEN + idx as u64, Control::Stage(plan)));
            }
            State::Stopped => self.nodes[0].deferred.push(Kind::Stage { idx }),
            State::Dead { .. } => {}
        }
    }

    pub(super) fn proc_event(&mut self, daemon: Rank, ev: ProcEvent) {
        match self.nodes[daemon as usize].state {
            State::Running => {
                if self.pmi_exit_closes(daemon, &ev) || !self.pmi_event_due(daemon, &ev) {
                    return;
                }
                if self.nodes[daemon as usize].shell.take(&ev) {
                    self.q.note(|| format!("d{daemon} PROC {ev:?}"));
                    let started = match ev {
                        ProcEvent::Started { jobid, rank, .. } => Some((jobid, rank)),
                        _ => None,
                    };
                    let closed = matches!(ev, ProcEvent::PmiClosed { .. }).then(|| ev.clone());
                    self.drive_in(daemon, In::Proc(ev));
                    if let Some((jobid, rank)) = started {
                        self.client_started(daemon, jobid, rank);
                    }
                    if let Some(ev) = closed {
                        self.pmi_told_closed(daemon, &ev);
                    }
                }
            }
            State::Stopped => self.nodes[daemon as usize].deferred.push(Kind::Proc { daemon, ev }),
            State::Dead { .. } => {}
        }
    }

    /// The HNP said something to a prun: record the job's end when it is the last word.
    pub(super) fn job_heard(&mut self, c: ClientId) {
        let idx = (c.0 - 1) as usize;
        if self.trace.launch_ends.get(idx).is_some_and(Option::is_none) {
            // The effect is applied right after this call; look again then.
            self.q.push(self.q.now(), Kind::Heard { idx });
        }
    }

    pub(super) fn heard(&mut self, idx: usize) {
        if self.trace.launch_ends[idx].is_none() {
            if let Some((code, why)) = self.nodes[0].shell.ended(client(idx)) {
                self.trace.launch_ends[idx] = Some((self.q.now(), code, why));
            }
        }
    }

    /// At the end of the run: what was left behind.
    pub(super) fn finish_jobs(&mut self) {
        for (r, n) in self.nodes.iter().enumerate() {
            self.trace.shell_errors.extend(n.shell.errors.iter().cloned());
            self.trace.peak_procs.push(n.shell.peak);
            if n.state != State::Running {
                continue;
            }
            for &(job, rank) in n.shell.procs.keys() {
                // (a daemon that exited took its procs with it)
                self.trace.leftover_procs.push((r as Rank, job, rank));
            }
        }
        if self.nodes[0].state == State::Running {
            self.trace.hnp_jobs_left = self.nodes[0].node.jobs().map_or(0, |j| j.len());
        }
    }
}

impl CoreEngine<'_> {
    /// Rank 0 of launch `idx` (on daemon 0: the mapper fills daemon 0's slot first) spawns a
    /// job, if its job started and still runs.
    pub(super) fn spawn(&mut self, idx: usize) {
        use dvm_proto::control::job_event;
        use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};
        match self.nodes[0].state {
            State::Running => {}
            State::Stopped => return self.nodes[0].deferred.push(Kind::Spawn { idx }),
            State::Dead { .. } => return,
        }
        if self.trace.launch_ends[idx].is_some() {
            return;
        }
        let started = self.nodes[0].shell.clients.get(&client(idx)).and_then(|items| {
            items.iter().find_map(|f| match f {
                dvm_core::jobs::Forward::Event(e) => match &e.event {
                    Some(job_event::Event::Started(s)) => Some(s.jobid),
                    _ => None,
                },
                _ => None,
            })
        });
        let Some(jobid) = started else { return };
        let sp = self.sc.launches[idx].spawn.clone().expect("planned");
        let argv = sp.program.argv();
        let app = wire::SpawnApp { cmd: argv[0].clone(), argv, maxprocs: sp.np as i32, ..Default::default() };
        let nspace = dvm_core::jobs::nspace_of(&self.nodes[0].node.router().dvm_id(), jobid);
        let proc = wire::Proc { nspace, rank: 0 };
        let spawn = wire::Spawn { proc: Some(proc), job_info: Vec::new(), apps: vec![app] };
        self.trace.spawns_asked[idx] = Some(self.q.now());
        self.q.note(|| format!("d0 SPAWN for launch {idx} (job {jobid})"));
        // The upcall's reply id is the launch's index + 1.
        let ev = wire::WorkerEvent { reply: idx as u64 + 1, body: Some(Ev::Spawn(spawn)) };
        self.drive_in(0, In::Pmix(ev));
    }

    /// pterm.
    pub(super) fn terminate(&mut self) {
        match self.nodes[0].state {
            State::Running => {
                self.trace.terminate_asked = Some(self.q.now());
                self.q.note(|| "d0 TERMINATE".into());
                self.drive_in(0, In::Control(u64::MAX, Control::Terminate));
            }
            State::Stopped => self.nodes[0].deferred.push(Kind::Terminate),
            State::Dead { .. } => {}
        }
    }
}

impl CoreEngine<'_> {
    /// The planned restart: the daemon is killed (`start` false), then its new incarnation
    /// starts and checks in (it must be told it cannot rejoin).
    pub(super) fn restart(&mut self, start: bool) {
        let Some(rp) = self.sc.restart.clone() else { return };
        let r = rp.rank;
        if !start {
            self.q.note(|| format!("RESTART: kill d{r}"));
            self.kill(r, true);
            return;
        }
        if !matches!(self.nodes[r as usize].state, State::Dead { .. }) || self.trace.restarted.is_some() {
            return;
        }
        self.q.note(|| format!("RESTART: d{r} starts again"));
        self.nodes[r as usize] = super::Node::fresh(self.sc, r, rp.epoch);
        self.trace.restarted = Some((r, self.q.now()));
        let own = dvm_proto::rml::Contact { epoch: rp.epoch, ..super::contact(r) };
        self.drive(r, dvm_core::Input::CheckIn(own));
    }
}
