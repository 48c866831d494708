//! `meshc run --transport mpi` for real (`make test-mpi`; cargo feature `mpi`, Open MPI
//! installed): every testdata graph × layout with `hosts` in its spec — 2 hosts × n/2
//! devices and hosts of 2 devices — compiled by `meshc compile` and run by `mpirun` on
//! simulated hosts over loopback TCP (`tools/mpirun-hosts`), writes outputs byte-identical
//! to the in-process run of the same artifact; so does the degraded 4×4 torus over 4 hosts.
//! A recv whose send never comes (`--stop-host`: rank 0 stops itself between two runs)
//! ends the job with exit 1 and a message naming the key, devices and hosts; a rank
//! killed mid-run ends it with a non-zero exit within the timeout;
//! `tools/mpirun-replan` restarts a job that lost a host without that host. And `meshc
//! generate --transport mpi`: the ONNX decoders with their heads split over 2 hosts × 1
//! device generate torch's greedy ids, with and without a prefill, and stop alike on every
//! rank; ranks given other stop ids are refused before the first step.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{input_args, layout_cases, meshc, scratch, Scratch};
use crate::generate::{printed, rows, DECODERS};
use crate::hosts::{compile, groupings};

/// `tools/mpirun-hosts HOSTS meshc ARGS...`.
fn mpirun(hosts: usize, args: &[String]) -> Output {
    Command::new("tools/mpirun-hosts")
        .arg(hosts.to_string())
        .arg(env!("CARGO_BIN_EXE_meshc"))
        .args(args)
        .output()
        .expect("tools/mpirun-hosts runs (Open MPI installed?)")
}

/// `spec` with `"hosts": hosts` added, written to `out`.
fn with_hosts(spec: &Path, hosts: &serde_json::Value, out: &Path) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(spec).unwrap()).unwrap();
    v["hosts"] = hosts.clone();
    std::fs::write(out, v.to_string()).unwrap();
}

/// The files of `dir`, sorted, with their bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .map(|p| (p.file_name().unwrap().to_string_lossy().into(), std::fs::read(&p).unwrap()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Runs `art` in-process and over `hosts` ranks; the failure, if the outputs differ.
fn compare(label: &str, graph: &Path, art: &Path, hosts: usize, extra: &[&str], dir: &Path) -> Result<(), String> {
    let (here, there) = (dir.join(format!("{label}-here")), dir.join(format!("{label}-mpi")));
    let base: Vec<String> = ["run".to_string(), art.display().to_string()]
        .into_iter()
        .chain(input_args(graph))
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
    let args = |out: &PathBuf, mpi: bool| -> Vec<String> {
        let mut a = base.clone();
        a.extend(["--output-dir".to_string(), out.display().to_string()]);
        if mpi {
            a.extend(["--transport".to_string(), "mpi".to_string()]);
        }
        a
    };
    let a = args(&here, false);
    let run = meshc(&a.iter().map(String::as_str).collect::<Vec<_>>());
    if run.status != Some(0) {
        return Err(format!("{label}: in-process run failed: {}", run.stderr));
    }
    let out = mpirun(hosts, &args(&there, true));
    if !out.status.success() {
        return Err(format!(
            "{label}: mpirun exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (want, got) = (files(&here), files(&there));
    if want.is_empty() || want != got {
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        return Err(format!(
            "{label}: outputs {:?} over MPI, {:?} in-process, or their bytes differ",
            names(&got),
            names(&want)
        ));
    }
    Ok(())
}

#[test]
fn every_layout_over_mpi_hosts_writes_the_in_process_outputs() {
    let dir = scratch("mpi-layouts");
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in layout_cases() {
        let devices = {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&case.spec).unwrap()).unwrap();
            v["mesh"]["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).product::<usize>()
        };
        if devices < 2 {
            continue;
        }
        for hosts in groupings(devices) {
            let label = format!("{}-{}x{}", case.label, hosts.len(), hosts[0].len());
            let spec = dir.join(format!("{label}.json"));
            with_hosts(&case.spec, &serde_json::json!(hosts), &spec);
            let art = dir.join(format!("{label}.mshc"));
            compile(&case.graph, &spec, &art);
            failures.extend(compare(&label, &case.graph, &art, hosts.len(), &[], &dir).err());
            runs += 1;
        }
    }
    assert!(runs >= 30, "only {runs} runs over MPI");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_degraded_torus_over_four_mpi_hosts_writes_its_in_process_outputs() {
    let dir = scratch("mpi-degraded");
    let graph = Path::new("testdata/dp_train/graph.json");
    let spec = dir.join("torus.json");
    with_hosts(Path::new("testdata/dp_train/layouts/torus-4x4.json"), &serde_json::json!({"axis": "dx"}), &spec);
    let art = dir.join("torus.mshc");
    compile(graph, &spec, &art);
    compare(
        "torus",
        graph,
        &art,
        4,
        &["--degrade", "1,2", "--degrade-link", "0,1:1,1", "--degrade-link", "3,0:0,0"],
        &dir,
    )
    .unwrap();
}

#[test]
fn mpirun_replan_restarts_a_job_that_lost_a_host_without_it() {
    let dir = scratch("mpi-replan");
    let graph = Path::new("testdata/dp_train/graph.json");
    let spec = dir.join("torus.json");
    with_hosts(Path::new("testdata/dp_train/layouts/torus-4x4.json"), &serde_json::json!({"axis": "dx"}), &spec);
    let art = dir.join("torus.mshc");
    compile(graph, &spec, &art);
    let (here, there) = (dir.join("here"), dir.join("mpi"));
    let mut args = vec!["run".to_string(), art.display().to_string()];
    args.extend(input_args(graph));
    let mut here_args = args.clone();
    here_args.extend(["--degrade-host", "1", "--output-dir", &here.display().to_string()].map(String::from));
    let run = meshc(&here_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(run.status, Some(0), "{}", run.stderr);
    // Device (1,0) of host 1 goes silent in the first attempt: its host reports it and the
    // job ends; the restart runs without host 1.
    args.extend(["--transport", "mpi", "--timeout", "2", "--fail-device", "1,0@0", "--output-dir"].map(String::from));
    args.push(there.display().to_string());
    let out = Command::new("tools/mpirun-replan")
        .args(["tools/mpirun-hosts", "4", env!("CARGO_BIN_EXE_meshc")])
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("mpirun-replan: host 1 was lost; running again with --degrade-host 1"), "{stderr}");
    assert_eq!(files(&there), files(&here));
    assert!(!files(&here).is_empty());
}

/// The pipeline mlp with its two stages on two hosts, compiled into `dir`.
fn stages(dir: &Path) -> PathBuf {
    let spec = dir.join("stages.json");
    with_hosts(Path::new("testdata/mlp/layouts/stages-2.json"), &serde_json::json!({"axis": "stage"}), &spec);
    let art = dir.join("stages.mshc");
    compile(Path::new("testdata/mlp/graph.json"), &spec, &art);
    art
}

/// The pipeline mlp on two MPI hosts with `--timeout 2`: an `mpirun` started with `run`
/// options `extra` and a mark in its environment, to find its ranks by.
struct Job {
    mpirun: Child,
    mark: String,
    /// Holds the artifact the ranks run.
    _dir: Scratch,
}

impl Job {
    fn stages(name: &str, extra: &[&str]) -> Job {
        let dir = scratch(name);
        let art = stages(&dir);
        let mark = format!("{name}-{}", std::process::id());
        let mut args = vec!["run".to_string(), art.display().to_string()];
        args.extend(input_args(Path::new("testdata/mlp/graph.json")));
        args.extend(["--transport", "mpi", "--timeout", "2"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let mpirun = Command::new("tools/mpirun-hosts")
            .arg("2")
            .arg(env!("CARGO_BIN_EXE_meshc"))
            .args(&args)
            .env("MESHC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Job { mpirun, mark, _dir: dir }
    }

    /// The pid of rank `rank` (the meshc process with this job's mark and that rank in its
    /// environment), once it runs.
    fn rank(&mut self, rank: usize) -> i32 {
        let wanted = [format!("MESHC_TEST_MARK={}", self.mark), format!("OMPI_COMM_WORLD_RANK={rank}")];
        let find = || {
            std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).find(
                |pid| {
                    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                    let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
                    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "meshc")
                        && wanted.iter().all(|w| vars.contains(&w.as_bytes()))
                },
            )
        };
        let start = Instant::now();
        loop {
            if let Some(pid) = find() {
                return pid;
            }
            assert!(!self.ended(), "the job ended before rank {rank} was found: {}", self.stderr());
            assert!(start.elapsed() < Duration::from_secs(60), "rank {rank} never started");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether mpirun has ended.
    fn ended(&mut self) -> bool {
        self.mpirun.try_wait().unwrap().is_some()
    }

    /// Waits for mpirun to end, at most 30 s after `since` (`what` happened then): its exit,
    /// its stderr and how long after `since` it ended.
    fn wait(mut self, since: Instant, what: &str) -> (Option<i32>, String, Duration) {
        let status = loop {
            if let Some(status) = self.mpirun.try_wait().unwrap() {
                break status;
            }
            if since.elapsed() > Duration::from_secs(30) {
                let _ = self.mpirun.kill();
                panic!("the job did not end 30 s after {what}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = since.elapsed();
        (status.code(), self.stderr(), took)
    }

    /// What mpirun wrote on stderr (once it has ended).
    fn stderr(&mut self) -> String {
        let mut stderr = String::new();
        std::io::Read::read_to_string(self.mpirun.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        stderr
    }
}

#[test]
fn a_recv_whose_send_never_comes_ends_the_job_with_exit_1_naming_key_devices_and_hosts() {
    // Rank 0 (stage 0) stops itself before its third run, after it has taken host 1's
    // outputs of the second: host 1 is then in its third run, waiting for activations
    // that never come. (A stop sent from here at some moment could land while host 1
    // sends its outputs to host 0 instead, and the job would end on the gather.)
    let mut job = Job::stages("mpi-stopped", &["--bench", "5", "--stop-host", "0@2"]);
    let pid = job.rank(0);
    let is_stopped = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    };
    let start = Instant::now();
    while !is_stopped() {
        assert!(!job.ended(), "the job ended before rank 0 stopped: {}", job.stderr());
        assert!(start.elapsed() < Duration::from_secs(60), "rank 0 never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, stderr, took) = job.wait(Instant::now(), "rank 0 stopped");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error: host 1: device 1 (1): node '")
            && stderr.contains(
                "on device 1 on host 1 (device 1) from device 0 on host 0 (device 0): no send came within 2s"
            ),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn a_rank_killed_mid_run_ends_the_job_with_a_failure() {
    let mut job = Job::stages("mpi-killed", &["--bench", "100000000"]);
    let pid = job.rank(1);
    // Mid-run: the ranks are past start-up and into the runs.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: a plain kill(2) of a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let (code, stderr, took) = job.wait(Instant::now(), "rank 1 was killed");
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn link_stats_count_the_bytes_each_host_sent_and_each_host_writes_its_trace() {
    let dir = scratch("mpi-link-stats");
    let graph = Path::new("testdata/transformer/graph.json");
    let art = dir.join("t.mshc");
    compile(graph, Path::new("testdata/transformer/hosts/mp-2x4.json"), &art);
    let mut args = vec!["run".to_string(), art.display().to_string(), "--transport".into(), "mpi".into()];
    args.extend(input_args(graph));
    let trace = dir.join("trace.json");
    args.extend(["--link-stats".into(), "--trace".into(), trace.display().to_string()]);
    let out = mpirun(2, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Every all_reduce of the model axis crosses both ways; host 1 also sends its outputs.
    for pair in ["host 0 -> host 1 ", "host 1 -> host 0 "] {
        let line = stdout.lines().find(|l| l.starts_with(pair)).unwrap_or_else(|| panic!("no '{pair}' in {stdout}"));
        let bytes: u64 = line[pair.len()..].trim_end_matches(" bytes").parse().unwrap();
        assert!(bytes > 0, "{line}");
    }
    // A trace per host, each with its own devices' steps.
    for file in [trace, dir.join("trace.host1.json")] {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(text.contains("\"ph\""), "{text}");
    }
}

/// Ranks that do not run the same thing — another artifact, another `--bench` count,
/// other input values — are refused before the first run, every rank naming the one that
/// differs, instead of silently wrong outputs or a timeout that blames another rank. Each
/// rank's command line comes from a script that picks it by the rank's number.
#[test]
fn ranks_that_differ_in_artifact_options_or_inputs_end_the_job_naming_the_rank() {
    let dir = scratch("mpi-agree");
    let art = stages(&dir);
    let dp = dir.join("dp.mshc");
    let spec = dir.join("dp.json");
    with_hosts(Path::new("testdata/mlp/layouts/dp-2.json"), &serde_json::json!({"axis": "data"}), &spec);
    compile(Path::new("testdata/mlp/graph.json"), &spec, &dp);
    let x = dir.join("x.npy");
    let mut t = meshc_ir::Tensor::read_npy(Path::new("testdata/mlp/inputs/x.npy")).unwrap();
    if let meshc_ir::Data::F32(v) = &mut t.data {
        v[0] += 1.0;
    }
    t.write_npy(&x).unwrap();
    let command = |art: &Path, x: &str, extra: &[&str]| -> String {
        let mut a = vec![env!("CARGO_BIN_EXE_meshc").to_string(), "run".into(), art.display().to_string()];
        a.extend([
            "--input".into(),
            format!("x={x}"),
            "--transport".into(),
            "mpi".into(),
            "--timeout".into(),
            "20".into(),
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(" ")
    };
    let same = command(&art, "testdata/mlp/inputs/x.npy", &[]);
    let x = x.display().to_string();
    for (rank1, differs) in [
        (command(&dp, "testdata/mlp/inputs/x.npy", &[]), "runs another artifact"),
        (
            command(&art, "testdata/mlp/inputs/x.npy", &["--bench", "2"]),
            "was given other options (--bench, --degrade*, --fail-device, --stop-host)",
        ),
        (command(&art, &x, &[]), "was given other inputs"),
    ] {
        let script = dir.join("rank.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec {rank1}; fi\nexec {same}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let start = Instant::now();
        let out = Command::new("tools/mpirun-hosts").arg("2").arg(&script).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{differs}: {stderr}");
        let want = format!("host 1 (device 1) {differs} than host 0 (device 0)");
        assert!(
            stderr.contains(&format!("error: host 0: {want}")) || stderr.contains(&format!("error: host 1: {want}")),
            "{stderr}"
        );
        assert!(start.elapsed() < Duration::from_secs(15), "{differs}: {:?}", start.elapsed());
    }
}

/// Issue 37's 2×1 (hosts × devices): each decoder's heads split over a model axis whose two
/// devices are two MPI hosts, the caches resident on each host's device between steps and
/// only host 0 sampling. The ids are torch's greedy ones, which the one-device run gives
/// too (tests/all/generate.rs), so every split agrees exactly: from the ONNX file (its
/// prefill compiled beside it), from artifacts with and without `--prefill`, and with a
/// stop id that ends one sequence early, after which every rank stops at the same step.
#[test]
fn onnx_decoders_generate_torchs_greedy_ids_over_two_mpi_hosts() {
    let dir = scratch("mpi-generate");
    for d in DECODERS {
        let name = Path::new(d).file_name().unwrap().to_string_lossy().to_string();
        let (model, prompt) = (format!("{d}/model.onnx"), format!("{d}/prompt.npy"));
        let want = rows(&format!("{d}/greedy.npy"));
        let spec = format!("{d}/layouts/heads-2-hosts.json");
        let heads_2: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{d}/layouts/heads-2.json")).unwrap()).unwrap();
        let mut hosts: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&spec).unwrap()).unwrap();
        assert_eq!(hosts["hosts"].take(), serde_json::json!({"axis": "model"}), "{spec}");
        assert_eq!(hosts.as_object().unwrap().len(), 4, "{spec}");
        hosts.as_object_mut().unwrap().remove("hosts");
        assert_eq!(hosts, heads_2, "{spec} is heads-2.json over two hosts");
        let generate = |what: &str, extra: &[&str]| {
            let mut args = vec!["generate".to_string(), what.to_string(), "--prompt".into(), prompt.clone()];
            args.extend(["--context", "37", "--max-new-tokens", "32", "--transport", "mpi"].map(String::from));
            args.extend(extra.iter().map(|s| s.to_string()));
            let out = mpirun(2, &args);
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(out.status.success(), "{name} {extra:?}: {stderr}");
            // Host 0 alone reports.
            assert_eq!(stderr.matches("new tokens in").count(), 1, "{name} {extra:?}: {stderr}");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        assert_eq!(printed(&generate(&model, &["--layout", &spec])), want, "{name}: the ONNX file");
        let compile = |extra: &[&str], out: &str| {
            let out = dir.join(format!("{name}-{out}")).display().to_string();
            let args = ["compile", &model, "--decode-context", "37", "--decode-batch", "2", "--layout", &spec, "-o"];
            let r = meshc(&[&args[..], &[out.as_str()], extra].concat());
            assert_eq!(r.status, Some(0), "{name}: {r:?}");
            out
        };
        let (step, prefill) = (compile(&[], "step.mshc"), compile(&["--decode-prefill", "5"], "prefill.mshc"));
        assert_eq!(printed(&generate(&step, &["--prefill", &prefill])), want, "{name}: with the prefill");
        let ids = dir.join(format!("{name}-ids.npy"));
        let stdout = generate(&step, &["--output", ids.to_str().unwrap()]);
        assert!(stdout.is_empty(), "{name}: {stdout}");
        assert_eq!(rows(ids.to_str().unwrap()), want, "{name}: the prompt fed a step at a time");
        // Sequence 0's first greedy id that sequence 1 never emits stops sequence 0 there;
        // sequence 1 runs on to the end.
        let i = (1..32).find(|&i| !want[1].contains(&want[0][i]) && !want[0][..i].contains(&want[0][i])).unwrap();
        let stop = want[0][i].to_string();
        let got = printed(&generate(&step, &["--prefill", &prefill, "--stop", &stop]));
        assert_eq!(got, [want[0][..=i].to_vec(), want[1].clone()], "{name}: --stop {stop}");
    }
}

/// Ranks of one generation given other stop ids would stop after different steps, one
/// then waiting for picks that never come: they are refused before the first step, every
/// rank naming the one that differs.
#[test]
fn generate_ranks_given_other_stop_ids_end_the_job_naming_the_rank() {
    let dir = scratch("mpi-generate-agree");
    let spec = dir.join("heads-hosts.json");
    with_hosts(Path::new("testdata/decoder/layouts/heads-2.json"), &serde_json::json!({"axis": "model"}), &spec);
    let art = dir.join("decoder.mshc");
    compile(Path::new("testdata/decoder/graph.json"), &spec, &art);
    let command = |extra: &[&str]| -> String {
        let mut a = vec![env!("CARGO_BIN_EXE_meshc").to_string(), "generate".into(), art.display().to_string()];
        a.extend(
            ["--prompt", "testdata/decoder/generate/prompt.npy", "--context", "16", "--max-new-tokens", "4"]
                .map(String::from),
        );
        a.extend(["--transport", "mpi"].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        a.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(" ")
    };
    let script = dir.join("rank.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec {}; fi\nexec {}\n",
            command(&["--stop", "3"]),
            command(&[])
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let start = Instant::now();
    let out = Command::new("tools/mpirun-hosts").arg("2").arg(&script).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let want = "host 1 (device 1) was given other options (--max-new-tokens, --context, --sample, --seed, --stop) \
                than host 0 (device 0)";
    assert!(
        stderr.contains(&format!("error: host 0: {want}")) || stderr.contains(&format!("error: host 1: {want}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(start.elapsed() < Duration::from_secs(15), "{:?}", start.elapsed());
}
