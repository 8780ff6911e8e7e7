//! `edgellm serve --board NAME` (and `model.board`) as a real process: the profile's threads
//! and CPUs applied, a kernel path other than the board's warned about, a memory budget the
//! configuration does not fit refused at start with every number, an unknown board refused
//! with the known names.

mod common;

use common::mqtt::{Daemon, edgellm};
use edgellm::model::{LoadOptions, Model};
use std::time::{Duration, Instant};

fn model() -> String {
    common::model_path("q4_0").to_str().unwrap().to_owned()
}

/// Runs `serve ARGS` to its exit (it must exit within a minute), returns (code, stderr).
fn serve_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut d = Daemon::spawn(args, &[]);
    let until = Instant::now() + Duration::from_secs(60);
    while d.is_running() {
        assert!(Instant::now() < until, "still running:\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let code = d.terminate(Duration::from_secs(1)).code();
    (code, d.log_text())
}

#[test]
fn a_context_the_boards_memory_cannot_hold_is_refused_at_start_with_the_numbers() {
    let m = model();
    let ctx = 131072u64;
    let (code, log) = serve_exit(&[
        "--model", &m, "--mqtt", "off", "--board", "rpi4b", "--ctx", "131072", "-t", "1",
    ]);
    // 78: refused as configured, so systemd does not restart it (RestartPreventExitStatus).
    assert_eq!(code, Some(78), "{log}");
    // The numbers, computed here from the model: one session's KV cache, f16, for each of
    // the board's batch of 4.
    let hp = Model::load(std::path::Path::new(&m), &LoadOptions::default())
        .unwrap()
        .hp;
    let kv = 2 * hp.n_layer as u64 * ctx * hp.kv_dim() as u64 * 2;
    let weights = std::fs::metadata(&m).unwrap().len();
    let budget = edgellm::board::get("rpi4b").unwrap().memory_budget();
    for want in [
        "board rpi4b".to_owned(),
        format!(
            "weights {:.1} MiB ({weights} bytes)",
            weights as f64 / 1048576.0
        ),
        format!(
            "4 session(s) x {:.1} MiB at model.ctx {ctx}",
            kv as f64 / 1048576.0
        ),
        format!("kv_type f16; {} bytes", 4 * kv),
        format!("memory budget of 1536.0 MiB ({budget} bytes"),
        "activations".to_owned(),
        "lower model.ctx".to_owned(),
    ] {
        assert!(log.contains(&want), "{want:?} not in:\n{log}");
    }
    assert!(!log.contains("READY") && !log.contains("panicked"), "{log}");
}

#[test]
fn resident_sessions_of_the_state_directory_count_against_the_budget() {
    let m = model();
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    // ctx 16384: 360 MiB a session, fits alone; a 2 GiB state.ram_budget keeps 5 resident.
    let cfg = state.path().join("edgellm.toml");
    std::fs::write(
        &cfg,
        format!("[model]\npath = \"{m}\"\nctx = 16384\nthreads = 1\nboard = \"rpi4b\"\n[mqtt]\nbroker = \"off\"\n[state]\ndir = \"{dir}\"\nram_budget = \"2G\"\n"),
    )
    .unwrap();
    let (code, log) = serve_exit(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(78), "{log}");
    // The batch's 4 and the 5 resident.
    assert!(log.contains("9 session(s) x 360.0 MiB"), "{log}");
}

#[test]
fn a_batch_the_boards_memory_cannot_hold_is_refused_at_start_and_a_smaller_one_starts() {
    let m = model();
    let state = tempfile::tempdir().unwrap();
    // ctx 20480: 450 MiB a session. One fits the Pi 4's 1536 MiB; four do not.
    let cfg = |batch: usize| {
        let p = state.path().join(format!("b{batch}.toml"));
        std::fs::write(
            &p,
            format!("[model]\npath = \"{m}\"\nctx = 20480\nthreads = 1\nboard = \"rpi4b\"\nmax_batch = {batch}\n[mqtt]\nbroker = \"off\"\n"),
        )
        .unwrap();
        p
    };
    let (code, log) = serve_exit(&["--config", cfg(4).to_str().unwrap()]);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("4 session(s) x 450.0 MiB"), "{log}");
    assert!(log.contains("model.max_batch"), "{log}");
    assert!(!log.contains("within the board's budget"), "{log}");
    let mut d = Daemon::start(&["--config", cfg(1).to_str().unwrap()], &[]);
    assert!(d.terminate(Duration::from_secs(20)).success());
}

#[test]
fn a_board_profile_sets_the_threads_and_says_when_the_kernel_path_is_not_the_boards() {
    let m = model();
    let mut d = Daemon::start(
        &[
            "--model", &m, "--mqtt", "off", "--board", "rpi4b", "--ctx", "256",
        ],
        &[],
    );
    let log = d.wait_log(Duration::from_secs(10), |l| {
        l.contains("board profile applied")
    });
    assert!(log.contains("board=rpi4b threads=4"), "{log}");
    let best = kernels_neon::Kernels::detect().unwrap().name();
    if best != "neon" {
        let want = format!("board rpi4b expects kernel path neon, but this CPU runs {best}");
        assert!(log.contains(&want), "{want:?} not in:\n{log}");
    }
    // The engine's threads run only on the profile's CPUs this machine has.
    let allowed = cpus_of(&format!("/proc/{}/status", d.child.id()));
    let want: Vec<usize> = (0..4).filter(|c| allowed.contains(c)).collect();
    // A thread names (and pins) itself once it runs: wait for the four to show.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut engine_threads = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{}/task", d.child.id())).unwrap() {
            let t = t.unwrap().path();
            let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
            // edgellm-w1..3 and edgellm-worker, the service's thread: the pool's thread 0.
            if name.starts_with("edgellm-w") {
                engine_threads.push((
                    name.trim().to_owned(),
                    cpus_of(t.join("status").to_str().unwrap()),
                ));
            }
        }
        if engine_threads.len() == 4 || Instant::now() > until {
            assert_eq!(engine_threads.len(), 4, "{engine_threads:?}");
            for (name, cpus) in &engine_threads {
                assert_eq!(cpus, &want, "{name}");
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.terminate(Duration::from_secs(20)).success());
}

/// The `Cpus_allowed_list` of a `/proc/…/status`.
fn cpus_of(status: &str) -> Vec<usize> {
    let s = std::fs::read_to_string(status).unwrap();
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    edgellm::board::cpu::parse_cpu_list(list).unwrap()
}

#[test]
fn explicit_threads_win_over_the_boards() {
    let m = model();
    let mut d = Daemon::start(
        &[
            "--model", &m, "--mqtt", "off", "--board", "rpi4b", "--ctx", "256", "-t", "1",
        ],
        &[],
    );
    let log = d.wait_log(Duration::from_secs(10), |l| {
        l.contains("board profile applied")
    });
    assert!(log.contains("board=rpi4b threads=1"), "{log}");
    assert!(d.terminate(Duration::from_secs(20)).success());
}

#[test]
fn check_prints_the_board_applied_and_an_unknown_board_lists_the_known_ones() {
    let m = model();
    let o = edgellm(&["serve", "--model", &m, "--board", "rk3588", "--check"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        out.contains("board rk3588: 4 threads (the board), CPUs 4-7, kernel path dotprod expected"),
        "{out}"
    );
    let o = edgellm(&["serve", "--model", &m, "--check"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("board none"));
    let o = edgellm(&["serve", "--model", &m, "--board", "rpi3", "--check"]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("model.board: unknown board \"rpi3\": known boards are rpi4b, rpi5, rk3588, imx8mp, generic-aarch64, x86-64-gateway"),
        "{e}"
    );
}

#[test]
fn a_profile_whose_cpus_this_machine_lacks_serves_unpinned_and_says_so() {
    let m = model();
    // The daemon inherits this thread's CPUs: one outside 4-7, on any machine.
    let allowed = cpus_of("/proc/thread-self/status");
    let cpu = *allowed.iter().find(|&&c| c < 4).expect("a CPU below 4");
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
    let mut d = Daemon::start(
        &[
            "--model", &m, "--mqtt", "off", "--board", "rk3588", "--ctx", "256",
        ],
        &[],
    );
    let log = d.wait_log(Duration::from_secs(10), |l| {
        l.contains("board profile applied")
    });
    assert!(
        log.contains(
            "board rk3588: none of its CPUs 4-7 is available to this process: threads not pinned"
        ),
        "{log}"
    );
    assert!(log.contains("board=rk3588 threads=4 cpus= "), "{log}");
    assert!(d.terminate(Duration::from_secs(20)).success());
}

/// The configuration the .deb and the Yocto recipe install names no model file: on every
/// board it resolves to that board's default in the model directories (the cache first,
/// then /usr/share/edgellm/models), and a missing one is refused naming the file to fetch.
#[test]
fn the_packaged_configuration_loads_each_boards_default_model() {
    let conf = common::repo_root().join("board/systemd/edgellm.toml");
    let conf = conf.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    std::fs::create_dir(cache.path().join("models")).unwrap();
    let run = |board: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_edgellm"))
            .args(["serve", "--config", conf, "--board", board, "--check"])
            .env("EDGELLM_CACHE", cache.path())
            .output()
            .unwrap()
    };
    for p in edgellm::board::profiles() {
        let file = &p.default_model;
        // Not in the cache (nor, on a test machine, in /usr/share): refused, naming it.
        let o = run(&p.name);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {e}", p.name);
        assert!(
            e.contains(&format!("board {}'s default model is {file}", p.name))
                && e.contains("models/fetch.sh default"),
            "{}: {e}",
            p.name
        );
        // In the cache: the configuration is good and names that file.
        let path = cache.path().join("models").join(file);
        std::fs::write(&path, b"").unwrap();
        let o = run(&p.name);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}: {o:?}", p.name);
        assert!(
            out.contains(&format!("configuration OK: model {}", path.display())),
            "{}: {out}",
            p.name
        );
        std::fs::remove_file(&path).unwrap();
    }
}
