//! MPI_Abort under the shim, in the order PMIX-NOTES.md found reliable (30/30): the abort
//! upcall arrives as an event, the host completes its reply, waits for the aborting rank to
//! exit by itself with the status, and only then kills the rest (by PID). Any log event Open
//! MPI sends on the way has its text extracted.

mod common;

use common::{build_mpi_program, drive, spawn_mpi_ranks, Host, Proc};
use pmix_shim::{PmixEvent, ProcId, Rank, SUCCESS};

const NS: &str = "dvm-test-mpiabort";

const ABORT_C: &str = r#"
#include <mpi.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Barrier(MPI_COMM_WORLD); /* rank 1 waits here until killed */
    MPI_Finalize();
    return 0;
}
"#;

#[test]
fn mpi_abort_reaches_the_host() {
    let host = Host::start();
    let exe = build_mpi_program(&host, "abort", ABORT_C);
    let envs = host.launch_job(NS, 2);
    let mut procs: Vec<Proc> = spawn_mpi_ranks(&exe, envs);

    let (mut aborts, mut logs, mut fences) = (Vec::new(), Vec::new(), Vec::new());
    drive(
        &host.rx,
        &mut procs,
        "MPI abort test",
        |ev| match ev {
            PmixEvent::ClientConnected { reply, .. } | PmixEvent::ClientFinalized { reply, .. } => {
                reply.complete(SUCCESS)
            }
            PmixEvent::FenceNb(f) => {
                let data = f.data.clone();
                fences.push(f.collect);
                f.reply.complete(SUCCESS, &data);
            }
            PmixEvent::Abort { proc, status, message, procs, reply } => {
                aborts.push((proc, status, message, procs));
                reply.complete(SUCCESS);
            }
            PmixEvent::Log { text, data, reply, .. } => {
                logs.push((text, data));
                reply.complete(SUCCESS);
            }
            other => panic!("unexpected event {other:?}"),
        },
        // Rank 0 exits by itself after the reply; rank 1 is left in its barrier.
        |p| p[0].exit.is_some(),
    );
    // Only now kill the survivor, by PID.
    let survivor_exited = procs[1].poll();
    drop(procs.pop());
    let (out, err) = procs[0].output();
    eprintln!("abort events {aborts:?}\nlog events {logs:?}\nrank 0 stderr:\n{err}");
    assert_eq!(procs[0].exit, Some(3), "aborting rank exits with its status\nstdout:\n{out}\nstderr:\n{err}");
    assert_eq!(survivor_exited, None, "rank 1 must still be blocked in its barrier");
    assert_eq!(aborts.len(), 1, "abort events: {aborts:?}");
    let (proc, status, _message, targets) = &aborts[0];
    assert_eq!(proc, &ProcId::new(NS, Rank::Id(0)));
    assert_eq!(*status, 3);
    // MPI_Abort(MPI_COMM_WORLD) names every proc of the job, or none (= the whole nspace).
    if let Some(t) = targets {
        assert!(t.iter().all(|p| p.nspace == NS) && !t.is_empty(), "abort targets must be procs of the job: {t:?}");
    }
    assert_eq!(fences.first(), Some(&true), "MPI_Init's modex collects");

    host.finish_job(NS, 2);
    drop(procs);
    host.stop();
}
