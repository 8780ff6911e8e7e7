//! A tty opened for a protocol: raw mode, line settings through termios, the kernel's RS-485
//! mode when asked, non-blocking reads and writes through tokio's `AsyncFd`.
//!
//! A pseudo-terminal takes every termios setting and paces nothing: the baud rate, parity and
//! stop bits only matter on a real UART (the emulated board has one).

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::stat::Mode;
use nix::sys::termios::{self, BaudRate, ControlFlags, InputFlags, SetArg};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parity {
    None,
    Even,
    Odd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    None,
    /// RTS/CTS hardware handshake.
    RtsCts,
    /// XON/XOFF in the byte stream (not for binary modes: 0x11 and 0x13 are data there).
    XonXoff,
}

/// How a port's line is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub baud: u32,
    /// 5 to 8.
    pub data_bits: u8,
    pub parity: Parity,
    /// 1 or 2.
    pub stop_bits: u8,
    pub flow: Flow,
    /// Let the kernel drive an RS-485 transceiver's direction line (RTS high while sending).
    pub rs485: bool,
}

/// Why a port could not be opened or set.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("{path}: cannot open: {errno}")]
    Open { path: PathBuf, errno: Errno },
    #[error("{path}: not a terminal, or its line cannot be set: {errno}")]
    Termios { path: PathBuf, errno: Errno },
    #[error(
        "{baud} baud is not a rate a tty can be set to (use 1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600, …)"
    )]
    Baud { baud: u32 },
    #[error("{path}: {source}")]
    Async {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The termios speed for `baud`, if a tty has one.
pub fn baud_rate(baud: u32) -> Option<BaudRate> {
    use BaudRate::*;
    Some(match baud {
        1200 => B1200,
        1800 => B1800,
        2400 => B2400,
        4800 => B4800,
        9600 => B9600,
        19200 => B19200,
        38400 => B38400,
        57600 => B57600,
        115_200 => B115200,
        230_400 => B230400,
        460_800 => B460800,
        500_000 => B500000,
        576_000 => B576000,
        921_600 => B921600,
        _ => return None,
    })
}

/// Whether device number `dev` is a Unix 98 pty's slave (majors 136 to 143, as
/// `Documentation/admin-guide/devices.txt` has them).
fn is_pty(dev: nix::libc::dev_t) -> bool {
    (136..=143).contains(&nix::sys::stat::major(dev))
}

/// An open, configured port.
pub struct Port {
    fd: AsyncFd<OwnedFd>,
    /// The device number of the open tty.
    rdev: nix::libc::dev_t,
    /// Why the RS-485 mode was not set (a pty or a UART without it), to report once.
    pub rs485_note: Option<String>,
}

impl Port {
    /// Opens `path` non-blocking, without making it our controlling terminal, in raw mode with
    /// `s`. Must run inside a tokio runtime.
    pub fn open(path: &Path, s: &Settings) -> Result<Port, PortError> {
        let speed = baud_rate(s.baud).ok_or(PortError::Baud { baud: s.baud })?;
        let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let raw = open(path, flags, Mode::empty()).map_err(|errno| PortError::Open {
            path: path.to_owned(),
            errno,
        })?;
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let tio_err = |errno| PortError::Termios {
            path: path.to_owned(),
            errno,
        };
        let mut t = termios::tcgetattr(fd.as_fd()).map_err(tio_err)?;
        termios::cfmakeraw(&mut t);
        termios::cfsetspeed(&mut t, speed).map_err(tio_err)?;
        let c = &mut t.control_flags;
        c.remove(ControlFlags::CSIZE | ControlFlags::PARENB | ControlFlags::PARODD);
        c.remove(ControlFlags::CSTOPB | ControlFlags::CRTSCTS);
        c.insert(match s.data_bits {
            5 => ControlFlags::CS5,
            6 => ControlFlags::CS6,
            7 => ControlFlags::CS7,
            _ => ControlFlags::CS8,
        });
        // CLOCAL: no modem lines to wait for; CREAD: receive.
        c.insert(ControlFlags::CLOCAL | ControlFlags::CREAD);
        match s.parity {
            Parity::None => {}
            Parity::Even => c.insert(ControlFlags::PARENB),
            Parity::Odd => c.insert(ControlFlags::PARENB | ControlFlags::PARODD),
        }
        if s.stop_bits == 2 {
            c.insert(ControlFlags::CSTOPB);
        }
        let i = &mut t.input_flags;
        i.remove(InputFlags::IXON | InputFlags::IXOFF | InputFlags::IXANY);
        match s.flow {
            Flow::None => {}
            Flow::RtsCts => t.control_flags.insert(ControlFlags::CRTSCTS),
            Flow::XonXoff => t.input_flags.insert(InputFlags::IXON | InputFlags::IXOFF),
        }
        // Reads return what has arrived; AsyncFd does the waiting.
        t.control_chars[termios::SpecialCharacterIndices::VMIN as usize] = 1;
        t.control_chars[termios::SpecialCharacterIndices::VTIME as usize] = 0;
        termios::tcsetattr(fd.as_fd(), SetArg::TCSANOW, &t).map_err(tio_err)?;
        // A UART's bytes that arrived before we set the line were read with other settings:
        // noise. A pty has no wire: what waits in it was written by the other end as it is (a
        // PLC that sends the moment the port is back), and discarding it loses that request.
        let rdev = nix::sys::stat::fstat(fd.as_raw_fd())
            .map_err(tio_err)?
            .st_rdev;
        if !is_pty(rdev) {
            let _ = termios::tcflush(fd.as_fd(), termios::FlushArg::TCIFLUSH);
        }
        let rs485_note = if s.rs485 {
            rs485::enable(fd.as_raw_fd()).err().map(rs485::note)
        } else {
            None
        };
        // SAFETY: the AsyncFd takes the OwnedFd, so the descriptor stays open and the same
        // until the AsyncFd is dropped, and `as_raw_fd` of an OwnedFd never changes.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::WRITABLE) }
                .map_err(|e| PortError::Async {
                    path: path.to_owned(),
                    source: e.into_parts().1,
                })?;
        Ok(Port {
            fd,
            rdev,
            rs485_note,
        })
    }

    /// Why `path` no longer leads to this port, if it names another device now: a link
    /// (a `socat` pty's, a udev name) left behind when its device went away can point at
    /// whatever device later takes the old node's number, and is pointed again at the real
    /// one when it comes back. A path that cannot be read now says nothing (a link being
    /// replaced, a directory briefly unreadable): the port is kept.
    pub fn moved_from(&self, path: &Path) -> Option<String> {
        let now = nix::sys::stat::stat(path).ok()?.st_rdev;
        (now != self.rdev).then(|| {
            format!(
                "{} now names another device ({}:{}, the port is {}:{})",
                path.display(),
                nix::sys::stat::major(now),
                nix::sys::stat::minor(now),
                nix::sys::stat::major(self.rdev),
                nix::sys::stat::minor(self.rdev),
            )
        })
    }

    /// The device node this descriptor is open on (the kernel's name for it, whatever link
    /// the configured path went through), for the log: a path that is a link may name
    /// another device after the port comes back.
    pub fn device(&self) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).ok()
    }

    /// Reads what has arrived (at least a byte). `Ok(0)`, `EIO` or a hang-up mean the other
    /// end went away.
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut g = self.fd.readable().await?;
            match g
                .try_io(|fd| nix::unistd::read(fd.as_raw_fd(), buf).map_err(std::io::Error::from))
            {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `bytes`, waiting while the line's buffer is full.
    pub async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let mut g = self.fd.writable().await?;
            match g
                .try_io(|fd| nix::unistd::write(fd.get_ref(), bytes).map_err(std::io::Error::from))
            {
                Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => bytes = &bytes[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

/// Entries created or renamed into the directory of a port's path (inotify): the moments its
/// path may start naming another device, so that [`Port::moved_from`] is asked then and not on
/// a timer (an idle daemon does not wake). Only the path's own directory is watched: a link
/// whose target's node is replaced elsewhere (a link to a link) is not seen.
pub struct PathWatch {
    fd: AsyncFd<Watch>,
}

struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl PathWatch {
    /// Watches the directory of `path`. Must run inside a tokio runtime.
    pub fn new(path: &Path) -> std::io::Result<PathWatch> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        ino.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)?;
        // SAFETY: the AsyncFd takes the Inotify, which owns its descriptor, so the descriptor
        // stays open and the same until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(Watch(ino), Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(PathWatch { fd })
    }

    /// Waits until entries were created or renamed into the directory (any of them: the
    /// caller looks at its path), and takes their events.
    pub async fn changed(&self) -> std::io::Result<()> {
        loop {
            let mut g = self.fd.readable().await?;
            match g.try_io(|w| {
                w.get_ref()
                    .0
                    .read_events()
                    .map(drop)
                    .map_err(std::io::Error::from)
            }) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }
}

/// The kernel's RS-485 mode (`TIOCSRS485`). libc has the ioctl number but not the structure,
/// so it is declared here as `<linux/serial.h>` has it.
pub(crate) mod rs485 {
    /// `struct serial_rs485`.
    #[repr(C)]
    #[derive(Default)]
    pub struct SerialRs485 {
        flags: u32,
        delay_rts_before_send: u32,
        delay_rts_after_send: u32,
        /// The union of `padding[5]` and the addressing fields: all zero.
        padding: [u32; 5],
    }
    const _: () = assert!(std::mem::size_of::<SerialRs485>() == 32);

    const SER_RS485_ENABLED: u32 = 1 << 0;
    /// RTS high while sending, low after: the usual transceiver wiring.
    const SER_RS485_RTS_ON_SEND: u32 = 1 << 1;

    nix::ioctl_write_ptr_bad!(set_rs485, nix::libc::TIOCSRS485, SerialRs485);

    /// What the log says of a port whose driver refused the mode.
    pub fn note(e: nix::errno::Errno) -> String {
        format!(
            "RS-485 direction control is not available on this port ({e}); the transceiver \
             must switch by itself"
        )
    }

    /// Turns the mode on; a pty answers `ENOTTY`.
    pub fn enable(fd: std::os::fd::RawFd) -> Result<(), nix::errno::Errno> {
        let conf = SerialRs485 {
            flags: SER_RS485_ENABLED | SER_RS485_RTS_ON_SEND,
            ..Default::default()
        };
        // SAFETY: `fd` is an open descriptor owned by the caller for the whole call, and
        // `conf` is a live `serial_rs485` of the kernel's layout (size checked above) that the
        // kernel only reads.
        unsafe { set_rs485(fd, &conf) }.map(drop)
    }
}
