//! `prun`'s command line: `prun [job options] [app options] EXE [ARGS...] [: [app options] EXE [ARGS...]]...`
//!
//! A hand-written parser (MPMD segments split by a lone `:` do not fit clap) that turns the
//! arguments into a [`JobSpec`](dvm_proto::job::JobSpec) plus what the caller needs to find or boot a DVM. It does no
//! I/O except reading a `--hostfile`, so every rule is testable without a DVM.
//!
//! Rules, following `mpirun`/`prterun` habits:
//! - Options take `--opt VALUE` or `--opt=VALUE`; short ones also `-n 4`, `-n4`, `-n=4`; the
//!   long ones also take a single dash (`-np 4`, `-host a`, `-wdir d`), as Open MPI did.
//! - The first token that is not an option is the app's executable; everything after it, even
//!   tokens that look like options, is its argv until a lone `:`. `--` ends the options early.
//! - App options (`-n`, `-x`, `--wdir`) belong to the app they precede, except that `-x` and
//!   `--wdir` before the first executable apply to every app (an app's own setting wins).
//! - Job options are only accepted before the first executable: after a `:` they would look
//!   per-app (as `--host` is in `mpirun`) while acting on the whole job, so they are refused.
//! - A single-value option given twice in one scope, an unknown option and a malformed value
//!   are errors naming the option as typed and the value; nothing falls back to a default.
//!
//! Traps: `args` excludes the program name. `--help`/`--version` short-circuit where they
//! appear, like clap: what follows them is not checked.//!
//! Split: `command` (what a command line turns into, its errors, `--help`), `options` (the
//! option table and value checks), `parser` (the walk over the arguments). This file only
//! re-exports; none of them imports it.

mod appfile;
mod command;
mod mcafile;
mod options;
mod output;
mod parser;
mod placement;
mod preload;
mod rankfile;

pub use command::{CliError, OneShot, PrunCommand, USAGE};
pub use parser::parse;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use dvm_proto::job::{AppContext, ArraySpec, BindTo, HwObj, JobSpec, MapBy, RankBy, StdinTarget};

    use super::options::{lookup, OPTIONS};
    use super::*;

    const CWD: &str = "/w";

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// Parsed, with the command line kept for listings cleared (`command_line_for_listings`
    /// checks it).
    fn run(s: &str) -> Result<PrunCommand, CliError> {
        parse(&words(s), Path::new(CWD), &env).map(|mut c| {
            c.spec.command.clear();
            c
        })
    }

    fn err(s: &str) -> String {
        match run(s) {
            Ok(c) => panic!("`prun {s}` was accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn app(argv: &[&str], np: u32, env: &[&str], wdir: &str) -> AppContext {
        AppContext {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            np,
            env: env.iter().map(|s| s.to_string()).collect(),
            wdir: wdir.into(),
            preload_binary: false,
        }
    }

    /// `prun a` as built by hand, then changed by `f`.
    fn expect(f: impl Fn(&mut PrunCommand)) -> PrunCommand {
        let mut c = PrunCommand {
            spec: JobSpec {
                apps: vec![app(&["a"], 0, &[], "")],
                map_by: MapBy::Slot as i32,
                stdin_target: StdinTarget::Rank as i32,
                cwd: CWD.into(),
                ..Default::default()
            },
            dvm_uri: None,
            one_shot: None,
            hostfile: None,
            host_list: None,
            launch_sizes: false,
            output_dir: None,
            output_file: None,
            attach: None,
            help: false,
            version: false,
        };
        f(&mut c);
        c
    }

    #[test]
    fn defaults() {
        assert_eq!(run("a").unwrap(), expect(|_| {}));
        assert_eq!(run("a").unwrap().one_shot_candidate(false), None);
    }

    #[test]
    fn every_option_in_every_form() {
        type Change = fn(&mut PrunCommand);
        let cases: &[(&[&str], Change)] = &[
            (&["-n 4", "-n=4", "-n4", "--np 4", "--np=4", "-np 4", "-np=4"], |c| c.spec.apps[0].np = 4),
            (&["-N 2", "-N2", "-N=2", "--npernode 2", "--npernode=2", "-npernode 2"], |c| {
                c.spec.map_by = MapBy::Ppr as i32;
                c.spec.ppr = 2;
            }),
            (&["--map-by node", "--map-by=node", "-map-by NODE", "--map-by=Node"], |c| {
                c.spec.map_by = MapBy::Node as i32
            }),
            (&["--map-by slot", "--map-by=slot"], |_| {}),
            (&["--map-by ppr:2:socket", "--map-by PPR:2:package"], |c| {
                c.spec.map_by = MapBy::Ppr as i32;
                c.spec.ppr = 2;
                c.spec.map_obj = HwObj::Package as i32;
            }),
            (&["--map-by numa:PE=2", "--map-by numa --cpus-per-rank 2", "--map-by=NUMA --cpus-per-proc=2"], |c| {
                c.spec.map_by = MapBy::Object as i32;
                c.spec.map_obj = HwObj::Numa as i32;
                c.spec.cpus_per_rank = 2;
            }),
            (&["--bind-to core:overload-allowed", "--bind-to=CORE:overload-allowed"], |c| {
                c.spec.bind_to = BindTo::Obj as i32;
                c.spec.bind_obj = HwObj::Core as i32;
                c.spec.bind_overload_allowed = true;
            }),
            (&["--bind-to none", "--bind-to=NONE"], |c| c.spec.bind_to = BindTo::None as i32),
            (&["--output timestamp", "--timestamp-output", "--output=timestamp"], |c| c.spec.timestamp_output = true),
            (&["--rank-by package", "--rank-by=SOCKET"], |c| {
                c.spec.rank_by = RankBy::Obj as i32;
                c.spec.rank_obj = HwObj::Package as i32;
            }),
            (&["--use-hwthread-cpus", "--map-by slot:hwtcpus"], |c| c.spec.use_hwthread_cpus = true),
            (
                &["--map-by slot:oversubscribe", "--map-by=SLOT:OVERSUBSCRIBE", "--oversubscribe", "-oversubscribe"],
                |c| c.spec.oversubscribe = true,
            ),
            (&["--map-by node:oversubscribe", "--map-by=node:OVERSUBSCRIBE", "--map-by node --oversubscribe"], |c| {
                c.spec.map_by = MapBy::Node as i32;
                c.spec.oversubscribe = true;
            }),
            (
                &["--map-by ppr:4:node:oversubscribe", "--map-by=PPR:4:NODE:oversubscribe", "-N 4 --oversubscribe"],
                |c| {
                    c.spec.map_by = MapBy::Ppr as i32;
                    c.spec.ppr = 4;
                    c.spec.oversubscribe = true;
                },
            ),
            (&["--host a,b:2", "--host=a,b:2", "-H a,b:2", "-Ha,b:2", "-H=a,b:2", "-host a,b:2"], |c| {
                c.spec.hosts = vec!["a".into(), "b".into()];
                c.host_list = Some("a,b:2".into());
            }),
            (&["--output tag", "--output=tag", "--tag-output", "-tag-output"], |c| c.spec.tag_output = true),
            (
                &["--output merge-stderr-to-stdout", "--output=merge-stderr-to-stdout", "--merge-stderr-to-stdout"],
                |c| c.spec.merge_stderr = true,
            ),
            (
                &[
                    "--output tag,merge-stderr-to-stdout",
                    "--output=merge-stderr-to-stdout,tag",
                    "--tag-output --merge-stderr-to-stdout",
                    "--output tag --merge-stderr-to-stdout",
                ],
                |c| {
                    c.spec.tag_output = true;
                    c.spec.merge_stderr = true;
                },
            ),
            (&["--stdin all", "--stdin=all", "--stdin ALL"], |c| c.spec.stdin_target = StdinTarget::All as i32),
            (&["--stdin none", "--stdin=none"], |c| c.spec.stdin_target = StdinTarget::None as i32),
            (&["--stdin rank", "--stdin=rank", "--stdin 0"], |_| {}),
            (&["--stdin 3", "--stdin=3"], |c| c.spec.stdin_rank = 3),
            (&["--timeout 2.5", "--timeout=2.5", "-timeout 2.5"], |c| c.spec.timeout_s = 2.5),
            (&["--timeout 60", "--timeout=60"], |c| c.spec.timeout_s = 60.0),
            (&["--mpi pmi1", "--mpi=pmi1", "-mpi pmi1"], |c| c.spec.mpi = dvm_proto::job::MpiInterface::MpiPmi1 as i32),
            (&["--dvm-uri tcp://h:1", "--dvm-uri=tcp://h:1"], |c| c.dvm_uri = Some("tcp://h:1".into())),
            (&["--dvm-uri file:u.txt", "--dvm-uri=file:./u.txt", "--dvm-uri file:/w/u.txt"], |c| {
                c.dvm_uri = Some("file:/w/u.txt".into())
            }),
            (
                &["--wdir sub", "--wdir=sub", "--wd sub", "-wdir sub", "-wd=sub", "--wdir ./sub/.", "--wdir /w/sub"],
                |c| c.spec.apps[0].wdir = "/w/sub".into(),
            ),
            (&["--wdir ../up", "--wdir=../up"], |c| c.spec.apps[0].wdir = "/w/../up".into()),
            (&["-x FOO=1", "-x=FOO=1", "-xFOO=1"], |c| c.spec.apps[0].env = vec!["FOO=1".into()]),
            (&["-x HOME", "-x=HOME", "-xHOME"], |c| c.spec.apps[0].env = vec!["HOME=/home/u".into()]),
            (&["-x EMPTY", "-x EMPTY="], |c| c.spec.apps[0].env = vec!["EMPTY=".into()]),
            (&["-x A=b=c"], |c| c.spec.apps[0].env = vec!["A=b=c".into()]),
            (&["--local 3", "--local=3", "-local 3"], |c| {
                c.one_shot = Some(OneShot::Local { daemons: 3, slots: None })
            }),
            (&["--local 3 --slots 2", "--slots=2 --local=3"], |c| {
                c.one_shot = Some(OneShot::Local { daemons: 3, slots: Some(2) })
            }),
            (&["--launch-sizes", "-launch-sizes"], |c| c.launch_sizes = true),
            (&["--enable-recovery", "-enable-recovery"], |c| c.spec.enable_recovery = true),
            (&["--no-queue", "-no-queue"], |c| c.spec.no_queue = true),
            (&["--display map,allocation,bind", "--display-map --display-allocation --report-bindings"], |c| {
                c.spec.display_map = true;
                c.spec.display_allocation = true;
                c.spec.report_bindings = true;
            }),
            (&["--display map", "-display-map", "--display=map"], |c| c.spec.display_map = true),
            (&["--output-filename out", "--output dir=out", "--output=dir=/w/out"], |c| {
                c.output_dir = Some(("/w/out".into(), false))
            }),
            (&["--output dir=out:nocopy"], |c| c.output_dir = Some(("/w/out".into(), true))),
            (&["--get-stack-traces", "--report-state-on-timeout"], |c| c.spec.get_stack_traces = true),
            (&["--detach", "-detach"], |c| c.spec.detach = true),
            (&["--array 3-7", "--array=3-7", "-array 3-7"], |c| {
                c.spec.array = Some(ArraySpec { first: 3, last: 7 });
                c.spec.apps[0].np = 1;
            }),
            (&["--array 10", "--array=0-9"], |c| {
                c.spec.array = Some(ArraySpec { first: 0, last: 9 });
                c.spec.apps[0].np = 1;
            }),
            (&["--"], |_| {}),
            (&["-n 2 --", "-n2 --"], |c| c.spec.apps[0].np = 2),
        ];
        for (variants, change) in cases {
            let want = expect(change);
            for v in *variants {
                let line = format!("{v} a");
                assert_eq!(run(&line).unwrap(), want, "prun {line}");
            }
        }
    }

    #[test]
    fn every_spelling_is_documented_and_parses() {
        for (kind, names) in OPTIONS {
            for name in *names {
                let documented =
                    USAGE.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '=').any(|w| w == *name);
                assert!(documented, "{name} is missing from USAGE");
                assert_eq!(lookup(name).unwrap().0, *kind, "{name}");
                if let Some(long) = name.strip_prefix('-').filter(|n| n.starts_with('-')) {
                    assert_eq!(lookup(long).unwrap(), (*kind, long.to_string(), None), "{long}");
                }
            }
        }
    }

    #[test]
    fn attach_takes_a_job_id_and_nothing_to_run() {
        let c = run("--attach 7").unwrap();
        assert_eq!((c.attach, c.spec.apps.len()), (Some(7), 1));
        assert_eq!(err("--attach 7 a"), "--attach and an executable cannot both be given");
        assert_eq!(err("--attach x"), "--attach 'x': not a job id (a positive integer)");
        assert_eq!(err("--local 2 --attach 7"), "--local and --attach cannot both be given");
        assert_eq!(err("--local 2 --detach a"), "--local and --detach cannot both be given");
        assert_eq!(err("--array 4 --detach a"), "--array and --detach cannot both be given");
        assert_eq!(err("--array 4 --no-queue a"), "--array and --no-queue cannot both be given");
        assert_eq!(err("--array 4 --oversubscribe a"), "--array and --oversubscribe cannot both be given");
        assert_eq!(err("--array 0 a"), "--array '0': an array of 0 jobs");
        assert_eq!(err("--array 5-2 a"), "--array '5-2': the first index 5 is above the last 2");
        assert_eq!(err("--array 1-x a"), "--array '1-x': 'x' is not an index (0 to 4294967295)");
        // An array's element is one process unless -n says otherwise.
        assert_eq!(run("--array 4 -n 3 a").unwrap().spec.apps[0].np, 3);
    }

    #[test]
    fn mca_options_become_the_ranks_environment() {
        let c = run("--mca btl self,vader --prtemca plm_base_verbose 5 -x A=1 --pmixmca gds hash --mca btl tcp a : b")
            .unwrap();
        let want = ["OMPI_MCA_btl=tcp", "PRTE_MCA_plm_base_verbose=5", "A=1", "PMIX_MCA_gds=hash"];
        assert_eq!(c.spec.apps[0].env, want);
        assert_eq!(c.spec.apps[1].env, want, "job-wide, like -x before the first app");
        assert_eq!(run("-gmca btl self a").unwrap().spec.apps[0].env, ["OMPI_MCA_btl=self"]);
        assert_eq!(err("--mca btl"), "--mca takes a parameter name and a value (--mca NAME VALUE)");
        assert_eq!(err("--mca=btl self a"), "--mca takes a parameter name and a value (--mca NAME VALUE)");
        assert_eq!(err("--mca b-tl x a"), "--mca b-tl: not a parameter name (letters, digits and '_')");
        assert_eq!(err("-x OMPI_MCA_btl=tcp --mca btl self a"), "-x OMPI_MCA_btl and --mca btl given twice");
        assert_eq!(
            err("a : --mca btl self b"),
            "--mca applies to the whole job: give it before the first executable, not in app 2"
        );
    }

    #[test]
    fn an_appfile_gives_the_apps() {
        let dir = std::env::temp_dir().join(format!("prun-appfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("apps");
        std::fs::write(&f, "# two apps\n-n 2 ./a \"x y\"\n\n  -n 1 -x B=2 ./b\n").unwrap();
        let fp = f.display().to_string();
        let c = parse(&words(&format!("--timeout 5 --app {fp} --tag-output")), Path::new(CWD), &env).unwrap();
        assert_eq!(c.spec.apps, vec![app(&["./a", "x y"], 2, &[], ""), app(&["./b"], 1, &["B=2"], "")]);
        assert_eq!((c.spec.timeout_s, c.spec.tag_output), (5.0, true));
        assert_eq!(
            err(&format!("--app {fp} ./c")),
            format!("--app {fp}: the apps come from the file; './c' on the command line too")
        );
        std::fs::write(&f, "-n 2 './a\n").unwrap();
        assert_eq!(err(&format!("--app={fp}")), format!("--app {fp}: line 1: unbalanced quotes"));
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(err(&format!("--app {fp}")).ends_with(": no app in it (one per line: '-n 2 ./a.out args')"));
        assert!(err("--app /nonexistent/apps").starts_with("--app /nonexistent/apps: cannot read it: "));
        assert_eq!(err("--app"), "--app needs a value");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn command_line_for_listings() {
        let c = parse(&words("-n 2 a x : -n 1 b"), Path::new(CWD), &env).unwrap();
        assert_eq!(c.spec.command, "a x : b");
    }

    #[test]
    fn help_and_version_short_circuit() {
        for line in ["-h", "--help", "-help", "-n 2 --help --bogus", "a : -h"] {
            let c = run(line).unwrap();
            assert!(c.help && !c.version, "prun {line}");
            assert!(c.spec.apps.is_empty());
        }
        for line in ["-V", "--version", "--map-by node --version"] {
            let c = run(line).unwrap();
            assert!(c.version && !c.help, "prun {line}");
        }
        assert_eq!(err("--bogus --help"), "unknown option '--bogus' (see prun --help)");
        assert!(!run("a --help").unwrap().help);
    }

    #[test]
    fn mpmd_three_apps_with_per_app_options() {
        let c = run("-x G=1 --wdir base -n 1 a x : -n 2 -x A=2 --wdir /t b : -x G=3 c -n 9 -x Q=1").unwrap();
        let want = expect(|c| {
            c.spec.apps = vec![
                app(&["a", "x"], 1, &["G=1"], "/w/base"),
                app(&["b"], 2, &["G=1", "A=2"], "/t"),
                app(&["c", "-n", "9", "-x", "Q=1"], 0, &["G=3"], "/w/base"),
            ]
        });
        assert_eq!(c, want);
    }

    #[test]
    fn export_global_versus_per_app() {
        let c = run("-x A=1 -x HOME a : -x A=9 b : c").unwrap();
        let envs: Vec<Vec<String>> = c.spec.apps.iter().map(|a| a.env.clone()).collect();
        assert_eq!(envs, vec![vec!["A=1", "HOME=/home/u"], vec!["HOME=/home/u", "A=9"], vec!["A=1", "HOME=/home/u"]]);
        // Per-app -x in one app only: nothing leaks to the others.
        let c = run("a : -x B=2 b : c").unwrap();
        let envs: Vec<usize> = c.spec.apps.iter().map(|a| a.env.len()).collect();
        assert_eq!(envs, vec![0, 1, 0]);
    }

    #[test]
    fn words_after_the_executable_are_its_argv() {
        let c = run("-n 2 a --np 3 -x FOO --help --bogus : b -- --timeout=x").unwrap();
        assert_eq!(c.spec.apps[0], app(&["a", "--np", "3", "-x", "FOO", "--help", "--bogus"], 2, &[], ""));
        assert_eq!(c.spec.apps[1], app(&["b", "--", "--timeout=x"], 0, &[], ""));
        assert!(!c.help);
        // `--` lets the executable start with a dash; ':' glued to a word is not a separator.
        let c = run("-- -weird -n 1 a: :b").unwrap();
        assert_eq!(c.spec.apps, vec![app(&["-weird", "-n", "1", "a:", ":b"], 0, &[], "")]);
    }

    #[test]
    fn stdin_rank_is_checked_when_every_np_is_known() {
        let c = run("-n 4 --stdin 3 a").unwrap();
        assert_eq!((c.spec.stdin_target, c.spec.stdin_rank), (StdinTarget::Rank as i32, 3));
        assert_eq!(err("-n 2 --stdin 2 a"), "--stdin 2: the job has only 2 procs");
        assert_eq!(run("-n 2 --stdin 2 a : -n 1 b").unwrap().spec.stdin_rank, 2);
        assert_eq!(err("-n 2 --stdin 3 a : -n 1 b"), "--stdin 3: the job has only 3 procs");
        // np 0 (fill) in any app: the mapper decides, so the rank cannot be checked here.
        assert_eq!(run("-n 2 --stdin 7 a : b").unwrap().spec.stdin_rank, 7);
        assert_eq!(run("-n 1 --stdin all a").unwrap().spec.stdin_target, StdinTarget::All as i32);
    }

    #[test]
    fn errors_name_the_option_and_value() {
        let cases = [
            ("--np x a", "--np 'x': not a positive integer"),
            ("-n 0 a", "-n '0': not a positive integer"),
            ("-n -3 a", "-n '-3': not a positive integer"),
            ("-n4x a", "-n '4x': not a positive integer"),
            ("--np= a", "--np '': not a positive integer"),
            ("--bogus a", "unknown option '--bogus' (see prun --help)"),
            ("--bogus=3 a", "unknown option '--bogus' (see prun --help)"),
            ("-q a", "unknown option '-q' (see prun --help)"),
            ("- a", "unknown option '-' (see prun --help)"),
            ("--n 4 a", "unknown option '--n' (see prun --help)"),
            ("--timeout 5 --timeout 6 a", "--timeout given twice"),
            ("--timeout 0 a", "--timeout '0': not a positive number of seconds"),
            ("--timeout -1 a", "--timeout '-1': not a positive number of seconds"),
            ("--timeout inf a", "--timeout 'inf': not a positive number of seconds"),
            ("--timeout 1m a", "--timeout '1m': not a positive number of seconds"),
            ("--map-by diagonal a", "--map-by 'diagonal': unknown policy 'diagonal': expected slot, node, hwthread, core, l3cache, numa, package or socket, or ppr:N:OBJ, then :PE=n, :oversubscribe, :nooversubscribe or :span"),
            ("--map-by ppr:2:blob a", "--map-by 'ppr:2:blob': unknown object 'blob' in ppr:2:blob (expected node, hwthread, core, l3cache, numa, package or socket)"),
            ("--map-by oversubscribe a", "--map-by 'oversubscribe': unknown policy 'oversubscribe': expected slot, node, hwthread, core, l3cache, numa, package or socket, or ppr:N:OBJ, then :PE=n, :oversubscribe, :nooversubscribe or :span"),
            ("--map-by node:span a", "--map-by 'node:span': :span spreads over objects: use it with --map-by hwthread, core, l3cache, numa, package or socket"),
            ("--map-by ppr:0:node a", "--map-by 'ppr:0:node': N in ppr:0:node must be a positive integer"),
            ("--bind-to core:loose a", "--bind-to 'core:loose': unknown qualifier 'loose' (expected :overload-allowed or :if-supported)"),
            ("--cpus-per-rank 0 a", "--cpus-per-rank '0': not a positive integer"),
            ("--map-by core:PE=2 --cpus-per-rank 2 a", "--map-by ...:PE and --cpus-per-rank cannot both be given"),
            ("--rankfile /nonexistent/rf a", "--rankfile /nonexistent/rf: cannot read it: No such file or directory (os error 2)"),
            ("--map-by node --map-by slot a", "--map-by given twice"),
            ("-N 2 -N 3 a", "-N given twice"),
            ("-N x a", "-N 'x': not a positive integer"),
            ("-N 2 --map-by node a", "-N and --map-by cannot both be given"),
            ("--map-by node -N 2 a", "--map-by and -N cannot both be given"),
            ("", "no executable given"),
            ("-n 2", "no executable given"),
            ("--launch-sizes", "no executable given"),
            ("--", "no executable given"),
            ("-n 2 : b", "app 1 before ':' has no executable"),
            ("a :", "app 2 after ':' has no executable"),
            ("a : -n 2", "app 2 after ':' has no executable"),
            ("a : : b", "app 2 after ':' has no executable"),
            ("a : b :", "app 3 after ':' has no executable"),
            ("-x FOO a", "-x FOO: FOO is not set in prun's environment"),
            ("a : -x FOO b", "-x FOO: FOO is not set in prun's environment"),
            ("-x =1 a", "-x '=1': expected VAR or VAR=value"),
            ("-x FOO=1 -x FOO=2 a", "-x FOO given twice"),
            ("a : -x B=1 -x B=1 b", "-x B given twice for app 2"),
            ("-n 2 -n 3 a", "-n given twice"),
            ("a : -n 2 --np 3 b", "--np given twice for app 2"),
            ("--wdir a --wdir b x", "--wdir given twice"),
            ("x : --wdir a --wd b y", "--wd given twice for app 2"),
            ("--wdir= x", "--wdir '': not a directory path"),
            ("--stdin 1 --stdin all a", "--stdin given twice"),
            ("--stdin first a", "--stdin 'first': expected rank, all, none or a rank number"),
            ("--stdin -1 a", "--stdin '-1': expected rank, all, none or a rank number"),
            ("--output tag --output tag a", "--output given twice"),
            ("--output dir=d,file=f a", "--output dir= and file= (or --output-filename) cannot both be given"),
            ("--output file=d/ a", "--output 'file=d/': file= needs a file name prefix"),
            (
                "--output stamp a",
                "--output 'stamp': expected tag, timestamp, merge-stderr-to-stdout, dir=DIR[:nocopy], file=PREFIX[:nocopy], or several separated by ','",
            ),
            ("--output tag, a", "--output 'tag,': expected tag, timestamp, merge-stderr-to-stdout, dir=DIR[:nocopy], file=PREFIX[:nocopy], or several separated by ','"),
            ("--dvm-uri x --dvm-uri y a", "--dvm-uri given twice"),
            ("--dvm-uri file: a", "--dvm-uri 'file:': expected a URI or file:PATH"),
            ("--dvm-uri= a", "--dvm-uri '': expected a URI or file:PATH"),
            ("--host a --host b x", "--host given twice"),
            ("--host a,a x", "--host: host 'a' is listed twice"),
            ("-H a,,b x", "--host: empty host name in 'a,,b'"),
            ("--host a --hostfile /nonexistent x", "--host and --hostfile cannot both be given"),
            (
                "a : --map-by node b",
                "--map-by applies to the whole job: give it before the first executable, not in app 2",
            ),
            ("a : -H h b", "-H applies to the whole job: give it before the first executable, not in app 2"),
            (
                "a : b : --timeout 3 c",
                "--timeout applies to the whole job: give it before the first executable, not in app 3",
            ),
            ("--np", "--np needs a value"),
            ("a : -x", "-x needs a value"),
            ("--oversubscribe=yes a", "--oversubscribe takes no value, got 'yes'"),
            ("--help=me a", "--help takes no value, got 'me'"),
            ("--slots 2 a", "--slots needs --local N"),
            ("--local 2 --slots 0 a", "--slots '0': not a positive integer"),
            ("--local 0 a", "--local '0': not a positive number of daemons"),
            ("--local 2 --local 3 a", "--local given twice"),
            ("--local 2 --dvm-uri u a", "--local and --dvm-uri cannot both be given"),
            ("--local 2 -H h a", "--local and -H cannot both be given"),
        ];
        for (line, want) in cases {
            assert_eq!(err(line), want, "prun {line}");
        }
    }

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let d = std::env::temp_dir().join(format!("prun-cli-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn mca_params_files_in_home_reach_the_ranks_below_the_command_line_and_environment() {
        let dir = TempDir::new("mcafile");
        std::fs::create_dir_all(dir.0.join(".openmpi")).unwrap();
        std::fs::create_dir_all(dir.0.join(".pmix")).unwrap();
        std::fs::write(
            dir.0.join(".openmpi/mca-params.conf"),
            "# site\nbtl = self,vader\nmpi_yield_when_idle=1\nmca_base_verbose = 5 # env wins\n",
        )
        .unwrap();
        std::fs::write(dir.0.join(".pmix/mca-params.conf"), "gds = hash\n").unwrap();
        let home = dir.0.display().to_string();
        let env = |name: &str| match name {
            "HOME" => Some(home.clone()),
            "OMPI_MCA_mca_base_verbose" => Some("0".into()),
            _ => None,
        };
        let c = parse(&words("--mca btl tcp,self a"), Path::new(CWD), &env).unwrap();
        let got: Vec<(String, String)> =
            c.spec.apps[0].env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
        let get = |k: &str| got.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OMPI_MCA_btl"), Some("tcp,self"), "the command line wins: {got:?}");
        assert_eq!(get("OMPI_MCA_mpi_yield_when_idle"), Some("1"));
        assert_eq!(get("PMIX_MCA_gds"), Some("hash"));
        assert_eq!(get("OMPI_MCA_mca_base_verbose"), Some("0"), "prun's environment wins");
        std::fs::write(dir.0.join(".openmpi/mca-params.conf"), "btl self\n").unwrap();
        let e = parse(&words("a"), Path::new(CWD), &env).unwrap_err().to_string();
        assert_eq!(e, format!("{home}/.openmpi/mca-params.conf:1: expected 'name = value'"));
    }

    #[test]
    fn hostfile_is_read_relative_to_cwd() {
        let dir = TempDir::new("hostfile");
        std::fs::write(dir.0.join("hf"), "# nodes\nn1 slots=4\nn2\n").unwrap();
        let path = dir.0.join("hf");
        for line in ["--hostfile hf a", "--hostfile=hf a", "--machinefile ./hf a", "-hostfile hf a"] {
            let c = parse(&words(line), &dir.0, &env).unwrap();
            assert_eq!(c.spec.hosts, vec!["n1".to_string(), "n2".to_string()], "prun {line}");
            assert_eq!(c.hostfile.as_deref(), Some(path.as_path()));
            assert_eq!(c.one_shot_candidate(false), Some(OneShot::Hostfile(path.clone())));
            assert_eq!(c.host_list, None);
        }
        let abs = format!("--hostfile {} a", path.display());
        assert_eq!(run(&abs).unwrap().hostfile, Some(path.clone()));
        assert_eq!(
            err(&format!("--hostfile {} --hostfile {} a", path.display(), path.display())),
            "--hostfile given twice"
        );
        assert_eq!(err(&format!("--hostfile {} -H n1 a", path.display())), "--hostfile and -H cannot both be given");
        assert_eq!(
            err(&format!("--local 2 --hostfile {} a", path.display())),
            "--local and --hostfile cannot both be given"
        );
        assert!(err("--hostfile nope a").starts_with("cannot read hostfile /w/nope: "), "{}", err("--hostfile nope a"));
        std::fs::write(dir.0.join("dup"), "n1\nn1\n").unwrap();
        let e = parse(&words("--hostfile dup a"), &dir.0, &env).unwrap_err();
        assert_eq!(e.to_string(), format!("{}:2: host 'n1' is already listed on line 1", dir.0.join("dup").display()));
    }

    #[test]
    fn one_shot_candidate_prefers_local_then_hostfile_then_hosts_then_slurm() {
        let c = run("--host a:2,b a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Hosts("a:2,b".into())));
        let c = run("--local 2 a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Local { daemons: 2, slots: None }));
        let c = run("a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Slurm));
        assert_eq!(c.one_shot_candidate(false), None);
    }

    #[test]
    fn non_utf8_cwd_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let cwd = Path::new(std::ffi::OsStr::from_bytes(b"/w/\xff"));
        let e = parse(&words("a"), cwd, &env).unwrap_err();
        assert_eq!(e.to_string(), "prun's working directory '/w/\u{fffd}' is not valid UTF-8");
    }

    /// Tiny deterministic generator (xorshift64*), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
    }

    /// Render `opt value` in one of the spellings a user may type.
    fn render(rng: &mut Rng, spellings: &[&str], value: &str, out: &mut Vec<String>) {
        let name = rng.pick(spellings);
        match rng.below(3) {
            0 => out.extend([name.to_string(), value.to_string()]),
            1 => out.push(format!("{name}={value}")),
            // `-n4`, or `-np 4` for a long name.
            _ if name.len() == 2 => out.push(format!("{name}{value}")),
            _ => out.extend([name[1..].to_string(), value.to_string()]),
        }
    }

    /// Random MPMD command lines, rendered with random spellings and option orders, parse to
    /// the job built directly from the model they were rendered from.
    #[test]
    fn random_command_lines_match_their_model() {
        let vars = ["A", "B", "HOME"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let napps = 1 + rng.below(4);
            let mut args: Vec<String> = Vec::new();
            let mut want_apps = Vec::new();
            let mut global_env: Vec<(String, String)> = Vec::new();
            let mut global_wdir = None;
            let mut want = expect(|_| {});
            for k in 0..napps {
                // Options of this segment, in a shuffled order.
                // Each option's words, and the variable it exports.
                type Var = Option<(String, String)>;
                let mut opts: Vec<(Vec<String>, Var)> = Vec::new();
                let np = rng.below(4) as u32;
                if np > 0 {
                    let mut o = Vec::new();
                    render(&mut rng, &["-n", "--np"], &np.to_string(), &mut o);
                    opts.push((o, None));
                }
                for v in vars {
                    if rng.below(3) == 0 {
                        let value = if v == "HOME" && rng.below(2) == 0 { None } else { Some(format!("{k}")) };
                        let mut o = Vec::new();
                        let text = value.as_ref().map_or(v.to_string(), |x| format!("{v}={x}"));
                        render(&mut rng, &["-x"], &text, &mut o);
                        opts.push((o, Some((v.to_string(), value.unwrap_or_else(|| "/home/u".into())))));
                    }
                }
                let wdir = (rng.below(3) == 0).then(|| format!("d{k}"));
                if let Some(w) = &wdir {
                    let mut o = Vec::new();
                    render(&mut rng, &["--wdir", "--wd"], w, &mut o);
                    opts.push((o, None));
                }
                if k == 0 {
                    if rng.below(2) == 0 {
                        let mut o = Vec::new();
                        render(&mut rng, &["-N", "--npernode"], "3", &mut o);
                        opts.push((o, None));
                        want.spec.map_by = MapBy::Ppr as i32;
                        want.spec.ppr = 3;
                    }
                    if rng.below(2) == 0 {
                        opts.push((vec!["--tag-output".into()], None));
                        want.spec.tag_output = true;
                    }
                    if rng.below(2) == 0 {
                        let mut o = Vec::new();
                        render(&mut rng, &["--timeout"], "7", &mut o);
                        opts.push((o, None));
                        want.spec.timeout_s = 7.0;
                    }
                }
                for i in (1..opts.len()).rev() {
                    let j = rng.below(i + 1);
                    opts.swap(i, j);
                }
                // -x takes effect in command-line order.
                let env: Vec<(String, String)> = opts.iter().filter_map(|(_, e)| e.clone()).collect();
                args.extend(opts.into_iter().flat_map(|(o, _)| o));
                let argv = vec![format!("exe{k}"), "-n".to_string(), ":x".to_string()];
                args.extend(argv.iter().cloned());
                if k + 1 < napps {
                    args.push(":".into());
                }
                if k == 0 {
                    global_env = env;
                    global_wdir = wdir.map(|w| format!("/w/{w}"));
                    want_apps.push((argv, np, Vec::new(), None));
                } else {
                    want_apps.push((argv, np, env, wdir.map(|w| format!("/w/{w}"))));
                }
            }
            want.spec.apps = want_apps
                .into_iter()
                .map(|(argv, np, env, wdir)| {
                    let mut merged: Vec<String> = global_env
                        .iter()
                        .filter(|(n, _)| !env.iter().any(|(m, _): &(String, String)| m == n))
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect();
                    merged.extend(env.iter().map(|(n, v)| format!("{n}={v}")));
                    AppContext {
                        argv,
                        np,
                        env: merged,
                        wdir: wdir.or(global_wdir.clone()).unwrap_or_default(),
                        preload_binary: false,
                    }
                })
                .collect();
            want.spec.command = want.spec.apps.iter().map(|a| a.argv.join(" ")).collect::<Vec<_>>().join(" : ");
            assert_eq!(parse(&args, Path::new(CWD), &env).unwrap(), want, "prun {}", args.join(" "));
        }
    }
}
