//! A state partition that fills up, or turns read-only, under the running daemon: the answers
//! go on, the status names each write that fails (session saves, the answer journal, the audit
//! trail), nothing written before is damaged, and everything clears when space returns or the
//! partition is repaired, across a restart too.
//!
//! The state directory is a small tmpfs, or an ext4 image on a loop device, in a mount
//! namespace of the test's own (`unshare`, held open by a `sleep`); the daemon runs in it
//! through `nsenter`, and the test reaches the files through `/proc/<holder>/root`. Needs root
//! (CAP_SYS_ADMIN, loop devices), as CI has.

mod common;

use common::mqtt::{Daemon, Mosquitto, ask, collect, edgellm, model_arg, subscribe};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);
const DEVICE: &str = "disk";

/// A mount namespace with a tmpfs of `size` on `dir`, kept alive by a sleeping process.
struct Namespace {
    holder: Child,
    dir: PathBuf,
}

impl Namespace {
    fn new(dir: &Path, size: &str) -> Namespace {
        Namespace::mounted(dir, &format!("mount -t tmpfs -o size={size} edgellm-state"))
    }

    /// `image`, an ext4 filesystem, on a loop device with `errors=remount-ro`: the kernel
    /// makes it read-only at its first error, files open for writing or not, as it does when a
    /// worn flash fails under a running appliance.
    fn ext4(dir: &Path, image: &Path) -> Namespace {
        let mount = format!("mount -o loop,errors=remount-ro {}", image.display());
        Namespace::mounted(dir, &mount)
    }

    /// Runs `mount DIR` in a new mount namespace kept by a sleeping process.
    fn mounted(dir: &Path, mount: &str) -> Namespace {
        std::fs::create_dir_all(dir).unwrap();
        let script = format!("{mount} \"$0\" && exec sleep 600");
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .arg(dir)
            .spawn()
            .expect("unshare (util-linux)");
        let ns = Namespace {
            holder,
            dir: dir.to_path_buf(),
        };
        // Mounted once the holder sees a filesystem on the directory.
        let until = Instant::now() + T;
        while ns.mount_line().is_none() {
            assert!(
                Instant::now() < until,
                "`{mount}` did not mount {} (root is needed)",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        ns
    }

    /// The holder's `/proc/mounts` line for the directory.
    fn mount_line(&self) -> Option<String> {
        let point = format!(" {} ", self.dir.display());
        mounts(self.holder.id())
            .lines()
            .find(|l| l.contains(&point))
            .map(str::to_owned)
    }

    /// The state directory as the daemon sees it.
    fn path(&self, rel: &str) -> PathBuf {
        let inside = self.dir.strip_prefix("/").unwrap();
        Path::new(&format!("/proc/{}/root", self.holder.id()))
            .join(inside)
            .join(rel)
    }

    fn nsenter(&self) -> String {
        format!("--mount=/proc/{}/ns/mnt", self.holder.id())
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn mounts(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/mounts")).unwrap_or_default()
}

fn serve(ns: &Namespace, port: u16) -> Daemon {
    let m = model_arg(&common::model_path("q4_0"));
    let url = format!("127.0.0.1:{port}");
    let dir = ns.dir.to_str().unwrap().to_owned();
    let enter = ns.nsenter();
    Daemon::start_wrapped(
        &["nsenter", &enter, "--"],
        &[
            "-m",
            &m,
            "--mqtt",
            &url,
            "--device",
            DEVICE,
            "--state-dir",
            &dir,
            "-c",
            "256",
            "-t",
            "2",
        ],
        &[("EDGELLM_LOG", "info")],
    )
}

fn status(port: u16) -> Value {
    let sub = subscribe(port, &format!("edgellm/{DEVICE}/status"), 1, 5);
    collect(sub)
        .first()
        .and_then(|(_, p)| serde_json::from_str(p).ok())
        .unwrap_or_default()
}

/// The status once `done` holds for it (or the last one seen, after `T`).
fn status_until(port: u16, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + T;
    loop {
        let s = status(port);
        if done(&s) || Instant::now() > until {
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn faults(s: &Value) -> Vec<String> {
    s["faults"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One turn of session `s1`; the answer must come whatever the disk does.
fn turn(port: u16, text: &str) -> String {
    let out = ask(port, DEVICE, &["--session", "s1", "-n", "8", text]);
    assert!(
        out.status.success(),
        "no answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!answer.is_empty(), "an empty answer to {text:?}");
    answer
}

/// Turns (at most `turns`, each answered) until the status names a fault of each record the
/// daemon writes: session saves, the answer journal, the audit trail. Returns those three.
fn record_faults(port: u16, turns: usize) -> Vec<String> {
    let want = ["sessions: ", "journal: ", "audit: "];
    let mut seen = Vec::new();
    for i in 0..turns {
        turn(port, &format!("Tell me more, part {i}."));
        seen = faults(&status(port));
        if want.iter().all(|w| seen.iter().any(|f| f.starts_with(w))) {
            break;
        }
    }
    want.iter()
        .map(|w| {
            let f = seen.iter().find(|f| f.starts_with(w));
            f.unwrap_or_else(|| panic!("no {w}fault in the status: {seen:?}"))
                .clone()
        })
        .collect()
}

/// Fills the filesystem of `file` until a write fails with ENOSPC; returns the bytes written.
fn fill(file: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(file).unwrap();
    let chunk = vec![0x55u8; 4096];
    let mut n = 0u64;
    // A 16 MiB tmpfs takes at most 4096 chunks.
    for _ in 0..8192 {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
                return n;
            }
        }
    }
    panic!("{} never filled up ({n} bytes written)", file.display());
}

/// The session file's SHA-256, once `edgellm kv verify` has passed it.
fn verified(file: &Path) -> String {
    let out = edgellm(&["kv", "verify", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    common::sha256_hex(&std::fs::read(file).unwrap())
}

fn audit_verify(ns: &Namespace) -> String {
    let out = edgellm(&[
        "audit",
        "verify",
        "--state-dir",
        ns.path("").to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn a_full_state_partition_costs_the_records_not_the_answers_and_clears_when_space_returns() {
    let broker = Mosquitto::start();
    let tmp = tempfile::tempdir().unwrap();
    let ns = Namespace::new(&tmp.path().join("state"), "16m");
    let mut d = serve(&ns, broker.port);

    turn(broker.port, "Hello, who are you?");
    let session = ns.path("sessions/s1.kv");
    let saved = verified(&session);
    assert!(faults(&status(broker.port)).is_empty());

    let filler = ns.path("filler");
    let filled = fill(&filler);
    eprintln!("filled the state partition with {filled} bytes");
    // Every write fails once the files' last pages are used up too: a few turns at most.
    for f in record_faults(broker.port, 12) {
        assert!(f.contains("No space left on device"), "{f}");
    }
    let s = status(broker.port);
    assert!(
        s["storage"]["session_save_failures"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert!(s["audit"]["failures"].as_u64().unwrap() >= 1, "{s}");

    // Nothing written before the disk filled is damaged.
    assert_eq!(verified(&session), saved, "the session file changed");
    audit_verify(&ns);

    // Space returns: the next turn is saved and recorded, and the faults clear.
    std::fs::remove_file(&filler).unwrap();
    turn(broker.port, "And finally?");
    let s = status_until(broker.port, |s| faults(s).is_empty());
    assert!(faults(&s).is_empty(), "the faults did not clear: {s}");
    // The turn's prompt is its one message: the file now holds that conversation.
    assert_ne!(verified(&session), saved, "the session was not saved again");
    let last = s["audit"]["last_seq"].as_u64().unwrap();
    assert_eq!(d.terminate(T).code(), Some(0), "{}", d.log_text());

    // After a restart: the journal holds no torn record (a partial write was taken back), the
    // audit chain verifies and goes on.
    let d2 = serve(&ns, broker.port);
    let log = d2.wait_log(T, |l| l.contains("answer journal opened"));
    assert!(log.contains("answer journal opened"), "{log}");
    assert!(!log.contains("torn or corrupt tail"), "{log}");
    turn(broker.port, "One more?");
    let v = audit_verify(&ns);
    assert!(v.contains(&format!("to {} verify", last + 1)), "{v}");
    drop(d2);
}

/// An error of the filesystem behind `ns` (ext4's own test trigger): with `errors=remount-ro`
/// the kernel aborts its journal and makes it read-only at once.
fn fail_filesystem(ns: &Namespace) {
    let line = ns.mount_line().unwrap();
    let dev = line.split_whitespace().next().unwrap();
    let name = Path::new(dev).file_name().unwrap().to_str().unwrap();
    let trigger = format!("/sys/fs/ext4/{name}/trigger_fs_error");
    std::fs::write(&trigger, "edgellm test\n").unwrap_or_else(|e| panic!("{trigger}: {e}"));
    let until = Instant::now() + T;
    // Linux 6.x marks it `emergency_ro` and keeps `rw` in the options; older kernels say `ro`.
    let read_only = |l: String| l.contains(" ro,") || l.contains("emergency_ro");
    while !read_only(ns.mount_line().unwrap()) {
        assert!(
            Instant::now() < until,
            "still writable: {:?}",
            ns.mount_line()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_state_partition_that_turns_read_only_costs_the_records_not_the_answers() {
    let broker = Mosquitto::start();
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("state.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .status()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(mkfs.success());
    let ns = Namespace::ext4(&tmp.path().join("state"), &image);
    let mut d = serve(&ns, broker.port);

    turn(broker.port, "Hello, who are you?");
    let session = ns.path("sessions/s1.kv");
    let saved = verified(&session);
    assert!(faults(&status(broker.port)).is_empty());

    fail_filesystem(&ns);
    // The answers go on; each kind of record names its failure.
    for f in record_faults(broker.port, 6) {
        eprintln!("{f}");
        // New files: EROFS; files it holds open: EIO, as the aborted journal answers.
        assert!(
            f.contains("Read-only file system") || f.contains("Input/output error"),
            "{f}"
        );
    }
    assert_eq!(d.terminate(T).code(), Some(0), "{}", d.log_text());
    drop(ns);

    // The technician's repair: fsck, then the daemon comes back on the same partition with
    // what was saved before the error intact.
    let fsck = Command::new("e2fsck")
        .args(["-f", "-y"])
        .arg(&image)
        .output()
        .expect("e2fsck");
    // 0: clean, 1: errors corrected.
    assert!(
        matches!(fsck.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let ns = Namespace::ext4(&tmp.path().join("state"), &image);
    assert_eq!(verified(&ns.path("sessions/s1.kv")), saved);
    audit_verify(&ns);
    let d = serve(&ns, broker.port);
    let out = ask(
        broker.port,
        DEVICE,
        &["--session", "s1", "-n", "4", "--json", "Still there?"],
    );
    let answer = common::json_of(&out);
    assert!(
        answer["usage"]["restored_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    let s = status_until(broker.port, |s| faults(s).is_empty());
    assert!(faults(&s).is_empty(), "{s}");
    drop(d);
}
