//! Sockets systemd opened for the daemon (`sd_listen_fds(3)`, by hand): a port below 1024,
//! such as Modbus TCP's 502, is bound by systemd in `edgellm-modbus.socket` and handed over,
//! so the unit keeps an empty capability set and still serves it.
//!
//! systemd sets `LISTEN_PID` (ours), `LISTEN_FDS` (how many, from fd 3 on) and
//! `LISTEN_FDNAMES` (colon-separated, `FileDescriptorName=`). The variables are read once; a
//! descriptor is taken at most once, by name, and only when it is a listening TCP socket.

use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;
/// More than any unit of ours passes; a larger count is not systemd's.
const MAX_FDS: usize = 16;

/// The passed descriptors not yet taken, by name; `None` until read.
static PASSED: Mutex<Option<Vec<(String, Option<OwnedFd>)>>> = Mutex::new(None);

/// What the environment says was passed: `(name, fd)` pairs, or why it cannot be trusted.
fn from_env() -> Result<Vec<(String, RawFd)>, String> {
    let var = |k| std::env::var(k).ok();
    let (Some(pid), Some(n)) = (var("LISTEN_PID"), var("LISTEN_FDS")) else {
        return Ok(Vec::new());
    };
    // Meant for another process (a parent that did not clear them): not ours to take.
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let n: usize = n
        .trim()
        .parse()
        .ok()
        .filter(|&n| n <= MAX_FDS)
        .ok_or_else(|| format!("LISTEN_FDS={n:?} is not a count of at most {MAX_FDS}"))?;
    let names: Vec<String> = var("LISTEN_FDNAMES")
        .map(|s| s.split(':').map(str::to_owned).collect())
        .unwrap_or_default();
    Ok((0..n)
        .map(|i| {
            let name = names.get(i).cloned().unwrap_or_else(|| "unknown".into());
            (name, FIRST_FD + i as RawFd)
        })
        .collect())
}

/// The listening TCP socket systemd passed under `name`; also an unnamed one when it is the
/// only socket passed (`systemd-socket-activate` without `--fdname`). `None`: none was
/// passed. An error: one was, but it is not a listening TCP socket.
pub fn tcp_listener(name: &str) -> Option<Result<TcpListener, String>> {
    let mut passed = PASSED.lock().unwrap_or_else(|e| e.into_inner());
    if passed.is_none() {
        let fds = match from_env() {
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        *passed = Some(
            fds.into_iter()
                .map(|(name, fd)| {
                    // SAFETY: systemd passed `fd` to this process (LISTEN_PID is ours) and it is
                    // adopted here once, under the lock, before anything else can use it.
                    (name, Some(unsafe { OwnedFd::from_raw_fd(fd) }))
                })
                .collect(),
        );
    }
    let list = passed.as_mut()?;
    let only_unnamed = list.len() == 1 && matches!(list[0].0.as_str(), "unknown" | "");
    let at = list
        .iter()
        .position(|(n, _)| n == name)
        .or(only_unnamed.then_some(0))?;
    let fd = list[at].1.take()?;
    Some(listener(fd).map_err(|e| format!("the socket systemd passed as {name:?}: {e}")))
}

fn listener(fd: OwnedFd) -> Result<TcpListener, String> {
    use nix::libc::{SO_ACCEPTCONN, SO_TYPE, SOCK_STREAM};
    use std::os::fd::AsRawFd;
    let stream = sockopt(&fd, SO_TYPE).map_err(|e| e.to_string())? == SOCK_STREAM;
    let listening = sockopt(&fd, SO_ACCEPTCONN).map_err(|e| e.to_string())? != 0;
    // Not for any process the daemon might start (systemd leaves it inheritable).
    nix::fcntl::fcntl(
        fd.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| e.to_string())?;
    let l = TcpListener::from(fd);
    // An address only an IPv4 or IPv6 socket has: a Unix socket fails here.
    let inet = l.local_addr().is_ok();
    if !(stream && listening && inet) {
        return Err("not a listening TCP socket (ListenStream= with a port)".into());
    }
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(l)
}

/// An integer socket option at `SOL_SOCKET` level.
fn sockopt(fd: &OwnedFd, name: nix::libc::c_int) -> std::io::Result<nix::libc::c_int> {
    use std::os::fd::AsRawFd;
    let mut value: nix::libc::c_int = 0;
    let mut len = std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t;
    // SAFETY: `fd` is open for the whole call; `value` and `len` are live locals of the size
    // `len` says, which getsockopt writes at most.
    let rc = unsafe {
        nix::libc::getsockopt(
            fd.as_raw_fd(),
            nix::libc::SOL_SOCKET,
            name,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(std::io::Error::last_os_error())
    }
}
