//! The strongest proof: two ranks of a real Open MPI 4.1 program (built with mpicc) run under
//! this process's libpmix server, wire up over the TCP BTL through our fence_nb answers, and
//! complete an MPI_Allreduce. Env per PMIX-NOTES.md: the server's setup_fork env plus
//! `OMPI_MCA_schizo=^orte` (else singletons), `pml=ob1`, `btl=self,tcp`, `btl_tcp_if_include=lo`.

mod common;

use common::{build_mpi_program, drive, spawn_mpi_ranks, Host, Proc};
use pmix_shim::{PmixEvent, ProcId, Rank, SUCCESS};

const NS: &str = "dvm-test-mpi";
const N: u32 = 2;

const HELLO_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank=%d\nsize=%d\nsum=%d\n", rank, size, sum);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
"#;

#[test]
fn open_mpi_allreduce_under_the_shim() {
    let host = Host::start();
    let exe = build_mpi_program(&host, "hello", HELLO_C);
    let envs = host.launch_job(NS, N);
    let mut procs: Vec<Proc> = spawn_mpi_ranks(&exe, envs);

    let (mut connected, mut finalized, mut fences, mut logs) = (0, 0, Vec::new(), Vec::new());
    drive(
        &host.rx,
        &mut procs,
        "MPI test",
        |ev| match ev {
            PmixEvent::ClientConnected { reply, .. } => {
                connected += 1;
                reply.complete(SUCCESS);
            }
            PmixEvent::ClientFinalized { reply, .. } => {
                finalized += 1;
                reply.complete(SUCCESS);
            }
            PmixEvent::FenceNb(f) => {
                let data = f.data.clone();
                fences.push((f.procs.clone(), f.collect, f.data.len(), f.local_status));
                f.reply.complete(SUCCESS, &data);
            }
            PmixEvent::Log { text, reply, .. } => {
                logs.push(text);
                reply.complete(SUCCESS);
            }
            other => panic!("unexpected event {other:?}"),
        },
        |p| p.iter().all(|p| p.exit.is_some()),
    );
    for p in &mut procs {
        let (out, err) = p.output();
        assert_eq!(p.exit, Some(0), "rank {} failed; logs {logs:?}\nstdout:\n{out}\nstderr:\n{err}", p.rank);
        let v = Proc::values(&out);
        assert_eq!(v["rank"], p.rank.to_string(), "stdout:\n{out}");
        assert_eq!(v["size"], N.to_string(), "size 1 = the singleton trap; stdout:\n{out}");
        assert_eq!(v["sum"], (N * (N + 1) / 2).to_string());
    }
    assert_eq!((connected, finalized), (N, N));
    eprintln!("MPI fences (procs, collect, bytes, local status): {fences:?}");
    // Open MPI 4.1: the MPI_Init modex collects data, then barriers without collect.
    let all = vec![ProcId::new(NS, Rank::Wildcard)];
    assert!(fences.len() >= 2, "fences: {fences:?}");
    assert!(fences.iter().all(|f| f.0 == all && f.3.unwrap_or(0) == 0), "fences: {fences:?}");
    assert!(fences[0].1 && fences[0].2 > 0, "modex fence must collect data: {fences:?}");
    assert!(fences[1..].iter().all(|f| !f.1), "later fences are barriers: {fences:?}");

    host.finish_job(NS, N);
    drop(procs);
    host.stop();
}
