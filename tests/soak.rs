//! A soak: named sessions created, resumed and evicted under a small disk budget
//! for `EDGELLM_SOAK_S` seconds (120 by default, the CI run; `EDGELLM_SOAK_S=1800` for the
//! figure in docs/reliability.md), against `edgellm serve` and a real Mosquitto. Every turn is
//! answered; after warm-up the resident size stays within 5% and the open descriptors do not
//! grow; the session files stay within the budget, which keeps the hot sessions (resumed turn
//! after turn) and evicts the cold ones.

mod common;

use common::mqtt::{Daemon, Mosquitto, ask};
use common::serial::rss_kib;
use std::time::{Duration, Instant};

const DEVICE: &str = "soak";
/// Cold sessions, more than the budget holds: each is evicted before its next turn.
const SESSIONS: usize = 40;
/// Context of the daemon: a session file holds at most this many positions (f16 KV,
/// SmolLM2-135M: 23,040 bytes each), so a hot session never outgrows 5.9 MB.
const CTX: usize = 256;
/// Room for the three hot sessions at their largest (17.7 MB) and a dozen cold ones: the cold
/// ones are evicted, the hot ones never have to be. (At 8 MiB and context 512 the hot ones
/// alone could fill it, and one was evicted in a CI rehearsal once turns came fast enough.)
const DISK_BUDGET: u64 = 32 << 20;

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn sessions_created_resumed_and_evicted_for_minutes_leave_memory_and_descriptors_flat() {
    let secs: u64 = std::env::var("EDGELLM_SOAK_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        format!(
            "[state]\ndisk_budget = {DISK_BUDGET}\nram_budget = \"8M\"\n[limits]\nmax_sessions = 24\n"
        ),
    )
    .unwrap();
    let m = common::model_path("q4_0").to_str().unwrap().to_owned();
    let url = format!("127.0.0.1:{}", broker.port);
    let d = Daemon::start(
        &[
            "--config",
            conf.to_str().unwrap(),
            "--model",
            &m,
            "--mqtt",
            &url,
            "--device",
            DEVICE,
            "--state-dir",
            state.to_str().unwrap(),
            "-c",
            &CTX.to_string(),
            "-t",
            "2",
        ],
        &[],
    );
    let pid = d.child.id();
    let start = Instant::now();
    let warm_up = Duration::from_secs(secs / 4);
    let until = start + Duration::from_secs(secs);
    let (mut turns, mut warm) = (0usize, None);
    let (mut rss_max, mut fds_max, mut disk_max) = (0u64, 0usize, 0u64);
    // Bounded by time, and by count (a turn takes far more than 10 ms).
    while Instant::now() < until && turns < 100 * secs as usize {
        // Three hot sessions resumed turn after turn; every fourth turn a cold one of forty,
        // which the budget evicts before its next turn comes round.
        let session = match turns % 4 {
            0 => format!("cold{}", turns / 4 % SESSIONS),
            n => format!("hot{n}"),
        };
        let out = ask(
            broker.port,
            DEVICE,
            &["--session", &session, "-n", "4", "Name a colour."],
        );
        assert!(
            out.status.success(),
            "turn {turns} ({session}) not answered: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        turns += 1;
        let now = (rss_kib(pid), fds(pid), dir_bytes(&state.join("sessions")));
        disk_max = disk_max.max(now.2);
        match warm {
            None if start.elapsed() >= warm_up => warm = Some(now),
            None => {}
            Some(_) => {
                rss_max = rss_max.max(now.0);
                fds_max = fds_max.max(now.1);
            }
        }
    }
    let (rss_warm, fds_warm, _) = warm.expect("the soak ended before its warm-up");
    let cold_files = |ext: &str| {
        std::fs::read_dir(state.join("sessions"))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("cold") && n.ends_with(ext))
            .count()
    };
    let (cold, cold_conversations) = (cold_files(".kv"), cold_files(".conv"));
    eprintln!(
        "soak: {secs} s, {turns} turns over 3 hot and {SESSIONS} cold sessions ({cold} cold files \
         left); RSS after warm-up {rss_warm} KiB, \
         at most {rss_max} KiB; descriptors {fds_warm}, at most {fds_max}; session files at \
         most {disk_max} of {DISK_BUDGET} bytes"
    );
    assert!(
        rss_max as f64 <= rss_warm as f64 * 1.05,
        "RSS grew from {rss_warm} to {rss_max} KiB"
    );
    assert!(
        fds_max <= fds_warm,
        "descriptors grew from {fds_warm} to {fds_max}"
    );
    assert!(
        disk_max <= DISK_BUDGET,
        "session files took {disk_max} bytes"
    );
    // The hot sessions were kept (resumed from their files), cold ones were evicted.
    for n in 1..=3 {
        let f = state.join(format!("sessions/hot{n}.kv"));
        assert!(
            f.exists(),
            "hot session {} was evicted\n{}",
            f.display(),
            d.log_text()
        );
    }
    assert!(
        0 < cold && cold < SESSIONS.min(turns / 4),
        "{cold} cold session files after {turns} turns: nothing was evicted"
    );
    // The budget evicts caches, not conversations: every cold session is still remembered.
    assert_eq!(
        cold_conversations,
        SESSIONS.min(turns / 4),
        "cold conversations kept"
    );
}
