//! Open MPI's error text reaches the host only through the `log` upcall (PMIX-NOTES.md), as
//! a DSS-packed buffer (key `pmix.log.msg`) whose last string is the rendered message. Provoke
//! the real "getting local rank failed" (registering any PMIX_PROC_DATA stops libpmix deriving
//! local ranks) and check the text the Log event carries.

mod common;

use common::{answer_routine, build_mpi_program, drive, spawn_mpi_ranks, Host, Proc, HOST_ALIAS};
use pmix_shim::{key_str, sys, Info, InfoValue, PmixEvent, Rank, SUCCESS};

const NS: &str = "dvm-test-mpilog";

const HELLO_C: &str = r#"
#include <mpi.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"#;

#[test]
fn open_mpi_show_help_arrives_as_log_text() {
    let host = Host::start();
    let exe = build_mpi_program(&host, "hello", HELLO_C);
    // The trap from PMIX-NOTES.md: any PMIX_PROC_DATA stops libpmix deriving local ranks, so
    // Open MPI's MPI_Init fails with "getting local rank failed" and reports it through log.
    let proc_data = Info::new(
        key_str(sys::PMIX_PROC_DATA),
        InfoValue::Infos(vec![Info::new(key_str(sys::PMIX_RANK), InfoValue::Rank(Rank::Id(0)))]),
    );
    let envs = host.launch_job_with(NS, 2, HOST_ALIAS, vec![proc_data]);
    let mut procs: Vec<Proc> = spawn_mpi_ranks(&exe, envs);
    let mut logs = Vec::new();
    let mut other = Vec::new();
    drive(
        &host.rx,
        &mut procs,
        "MPI log test",
        |ev| match answer_routine(ev) {
            None => {}
            Some(PmixEvent::Log { text, data, reply, .. }) => {
                logs.push((text, data));
                reply.complete(SUCCESS);
            }
            Some(PmixEvent::Abort { status, message, reply, .. }) => {
                other.push(format!("abort {status} {message}"));
                reply.complete(SUCCESS);
            }
            Some(ev) => panic!("unexpected event {ev:?}"),
        },
        |p| p.iter().all(|p| p.exit.is_some()),
    );
    let mut stderrs = String::new();
    for p in &mut procs {
        let (_, err) = p.output();
        assert!(matches!(p.exit, Some(c) if c != 0), "rank {} must fail MPI_Init; stderr:\n{err}", p.rank);
        stderrs += &err;
    }
    let texts: Vec<&str> = logs.iter().filter_map(|(t, _)| t.as_deref()).collect();
    let hits = texts.iter().filter(|t| t.contains("getting local rank failed")).count();
    assert_eq!(hits, 2, "one 'getting local rank failed' per rank; log texts {texts:#?}\nranks' stderr:\n{stderrs}");
    // The text is the rendered message, not the DSS framing around it.
    assert!(texts.iter().all(|t| t.starts_with("-----") && t.trim_end().ends_with("-----")), "{texts:#?}");
    assert!(
        logs.iter().all(|(_, d)| d.iter().any(|i| i.key == "pmix.log.msg" && matches!(i.value, InfoValue::Bytes(_)))),
        "Open MPI sends its text as bytes under pmix.log.msg"
    );
    assert_eq!(other, Vec::<String>::new());
    host.finish_job(NS, 2);
    drop(procs);
    host.stop();
}
