//! Which process-management interface a job's ranks get (`prun --mpi`, `dvmd --mpi`), and
//! the environment that steers each MPI family to it.
//!
//! The default offers both: the PMIx server (Open MPI 4.1 and 5, Intel MPI when told) and a
//! PMI-1/PMI-2 fd (MPICH, Intel MPI, MVAPICH). Each MPI takes the one it speaks
//! (docs/mpi.md: what each MPI does when offered both). Under an explicit choice the other
//! interface is still offered, only to catch a wrong choice: a rank that speaks PMI under
//! `--mpi pmix`, or PMIx under `--mpi pmi1|pmi2`, fails its job by name instead of running
//! as a singleton.
//!
//! Never: a decision about a rank; only what the job asked. Do not break: `MPI_DEFAULT`
//! never reaches a daemon's decision unresolved.

use dvm_proto::job::MpiInterface;

/// A job's interface, resolved against the DVM's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interface(MpiInterface);

impl Interface {
    /// What job `asked` (a wire value: unknown numbers mean the default) gets on a DVM whose
    /// default is `dvm`.
    pub fn of(asked: i32, dvm: MpiInterface) -> Interface {
        let asked = MpiInterface::try_from(asked).unwrap_or(MpiInterface::MpiDefault);
        Interface(match (asked, dvm) {
            (MpiInterface::MpiDefault, MpiInterface::MpiDefault) => MpiInterface::MpiBoth,
            (MpiInterface::MpiDefault, d) => d,
            (a, _) => a,
        })
    }

    pub fn get(self) -> MpiInterface {
        self.0
    }

    /// The ranks get the PMIx server (served, or watched under `pmi1`/`pmi2`).
    pub fn pmix(self) -> bool {
        !matches!(self.0, MpiInterface::MpiNone)
    }

    /// Under `--mpi pmi1|pmi2`, why a rank that connects to the PMIx server is refused (an
    /// Open MPI rank would otherwise run as a singleton).
    pub fn pmix_refusal(self) -> Option<String> {
        let name = self.name();
        matches!(self.0, MpiInterface::MpiPmi1 | MpiInterface::MpiPmi2).then(|| {
            format!("speaks PMIx (Open MPI) but the job was started with --mpi {name}: run it with --mpi pmix or the default")
        })
    }

    /// The ranks get a PMI fd (served, or watched under `pmix`).
    pub fn pmi_fd(self) -> bool {
        !matches!(self.0, MpiInterface::MpiNone)
    }

    /// Under `--mpi pmix`, why a rank that speaks PMI is refused.
    pub fn pmi_refusal(self) -> Option<String> {
        (self.0 == MpiInterface::MpiPmix).then(|| {
            "speaks PMI (an MPICH-family MPI) but the job was started with --mpi pmix: run it with \
             --mpi pmi1, --mpi pmi2 or the default"
                .to_owned()
        })
    }

    /// What steers each MPI family to this interface (the app's own `-x` wins).
    pub fn env(self, pmix_library: Option<&str>) -> Vec<(String, String)> {
        let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        match self.0 {
            MpiInterface::MpiPmix => {
                let mut env = vec![kv("I_MPI_PMI", "pmix")];
                env.extend(pmix_library.map(|l| kv("I_MPI_PMI_LIBRARY", l)));
                env
            }
            // MPICH 5 refuses to choose when it sees both PMI_SIZE and PMIX_NAMESPACE ("Auto-
            // detection of PMI version failed"): told, it takes PMI-1, which every MPICH speaks.
            MpiInterface::MpiBoth => vec![kv("MPIR_CVAR_PMI_VERSION", "1")],
            MpiInterface::MpiPmi1 => vec![kv("I_MPI_PMI", "pmi"), kv("MPIR_CVAR_PMI_VERSION", "1")],
            MpiInterface::MpiPmi2 => vec![kv("I_MPI_PMI", "pmi2"), kv("MPIR_CVAR_PMI_VERSION", "2")],
            _ => Vec::new(),
        }
    }

    /// The name `--mpi` takes.
    pub fn name(self) -> &'static str {
        name_of(self.0)
    }
}

/// The `--mpi` name of an interface.
pub fn name_of(m: MpiInterface) -> &'static str {
    match m {
        MpiInterface::MpiDefault => "default",
        MpiInterface::MpiBoth => "both",
        MpiInterface::MpiPmix => "pmix",
        MpiInterface::MpiPmi1 => "pmi1",
        MpiInterface::MpiPmi2 => "pmi2",
        MpiInterface::MpiNone => "none",
    }
}

/// `--mpi NAME`, or what was wrong with it.
pub fn parse(name: &str) -> Result<MpiInterface, String> {
    Ok(match name {
        "both" | "default" => MpiInterface::MpiBoth,
        "pmix" => MpiInterface::MpiPmix,
        "pmi1" | "pmi" => MpiInterface::MpiPmi1,
        "pmi2" => MpiInterface::MpiPmi2,
        "none" => MpiInterface::MpiNone,
        other => return Err(format!("--mpi '{other}' is not one of pmix, pmi1, pmi2, both, none")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_wins_over_the_dvm_and_the_default_offers_both() {
        let both = Interface::of(MpiInterface::MpiDefault as i32, MpiInterface::MpiDefault);
        assert!(both.pmix() && both.pmi_fd() && both.pmi_refusal().is_none() && both.pmix_refusal().is_none());
        let dvm = Interface::of(MpiInterface::MpiDefault as i32, MpiInterface::MpiPmi1);
        assert_eq!(dvm.get(), MpiInterface::MpiPmi1);
        let job = Interface::of(MpiInterface::MpiNone as i32, MpiInterface::MpiPmi1);
        assert!(!job.pmix() && !job.pmi_fd());
        // A number from a newer prun is the default, not a panic.
        assert_eq!(Interface::of(99, MpiInterface::MpiPmix).get(), MpiInterface::MpiPmix);
    }

    #[test]
    fn pmix_watches_the_pmi_fd_and_every_name_parses_back() {
        let pmix = Interface::of(MpiInterface::MpiPmix as i32, MpiInterface::MpiDefault);
        assert!(pmix.pmi_fd() && pmix.pmi_refusal().is_some() && pmix.pmix_refusal().is_none());
        let pmi2 = Interface::of(MpiInterface::MpiPmi2 as i32, MpiInterface::MpiDefault);
        assert!(pmi2.pmix() && pmi2.pmix_refusal().is_some_and(|r| r.contains("--mpi pmi2")));
        for m in [MpiInterface::MpiPmix, MpiInterface::MpiPmi1, MpiInterface::MpiPmi2, MpiInterface::MpiNone] {
            assert_eq!(parse(name_of(m)), Ok(m));
        }
        assert!(parse("mpich").unwrap_err().contains("'mpich'"));
    }
}
