//! The console against the running daemon on a real pseudo-terminal, driven as picocom would
//! drive it: echo, Backspace, Ctrl-U, the commands, a streamed answer and Ctrl-C.

mod common;

use common::mqtt::{Daemon, model_arg};
use common::serial::{Pty, until};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[test]
fn the_console_on_a_pty_edits_answers_commands_and_cancels_with_ctrl_c() {
    let mut p = Pty::open();
    let m = model_arg(&common::model_path("q4_0"));
    let spec = format!("{}:115200:console", p.path);
    let args = [
        "-m", &m, "--mqtt", "off", "-c", "256", "-t", "2", "--serial", &spec,
    ];
    let mut d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.contains("serial port open"));
    assert!(log.contains("serial port open"), "{log}");

    // The prompt comes by itself when the port opens, and again for an empty line.
    assert_eq!(until(&mut p, "edgellm> ", T), "\r\nedgellm> ");
    p.send(b"\r");
    assert_eq!(until(&mut p, "edgellm> ", T), "\r\nedgellm> ");
    // Echo and Backspace, as a terminal sends them one key at a time.
    for b in b"helo\x7fp" {
        p.send(&[*b]);
    }
    assert_eq!(until(&mut p, "p", T), "helo\x08 \x08p");
    p.send(b"\r");
    let help = until(&mut p, "edgellm> ", T);
    assert!(
        help.contains("status") && help.contains("Ctrl-C"),
        "{help:?}"
    );
    // Ctrl-U erases what was typed; an arrow key echoes nothing.
    p.send(b"abc\x1b[A\x15");
    assert_eq!(
        until(&mut p, "\x08 \x08\x08 \x08\x08 \x08", T),
        "abc\x08 \x08\x08 \x08\x08 \x08"
    );
    p.send(b"status\r");
    let s = until(&mut p, "edgellm> ", T);
    assert!(
        s.contains("state      online") && s.contains("port_checksum_errors"),
        "{s:?}"
    );
    p.send(b"log 5\r");
    let l = until(&mut p, "edgellm> ", T);
    assert!(l.contains("serial port open"), "{l:?}");

    // A question: the answer streams; Ctrl-C after its first bytes cancels it.
    p.send(b"Tell me a long story about a dragon.\r");
    let first = until(&mut p, "\r\n", T);
    assert!(first.starts_with("Tell me a long story"), "{first:?}");
    let _ = until(&mut p, " ", T);
    p.send(b"\x03");
    let rest = until(&mut p, "edgellm> ", T);
    assert!(
        rest.contains("^C") && rest.contains("[cancelled · "),
        "{rest:?}"
    );
    assert!(
        !rest.replace("\r\n", "").contains('\n'),
        "a bare LF: {rest:?}"
    );
    // After the cancelled answer the console takes a new line.
    p.send(b"help\r");
    assert!(until(&mut p, "edgellm> ", T).contains("sessions"));
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
}

#[test]
fn a_megabyte_of_random_keys_leaves_memory_flat_and_the_console_answering() {
    let mut p = Pty::open();
    let m = model_arg(&common::model_path("q4_0"));
    let spec = format!("{}:115200:console", p.path);
    let args = ["-m", &m, "--mqtt", "off", "-c", "256", "--serial", &spec];
    let mut d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    until(&mut p, "edgellm> ", T);
    let pid = d.child.id();
    let before = common::serial::rss_kib(pid);
    let mut noise = common::serial::Noise(0x2545_f491_4f6c_dd1d);
    let mut chunk = vec![0u8; 16 << 10];
    for _ in 0..64 {
        // No Enter and no Ctrl-C: one endless line of keys, escapes and bad UTF-8.
        noise.fill(&mut chunk, b"\r\n\x03", b'x');
        // Reading the echo meanwhile, or the pty fills and both ends wait.
        p.pump(&chunk, T);
    }
    p.drain(Duration::from_millis(300));
    // Ctrl-U clears whatever is left of the line; then a command works.
    p.send(b"\x15status\r");
    let s = until(&mut p, "edgellm> ", T);
    assert!(s.contains("queue"), "{s:?}");
    let after = common::serial::rss_kib(pid);
    eprintln!("RSS {before} -> {after} KiB");
    assert!(
        after < before + 512,
        "memory grew from {before} to {after} KiB"
    );
    d.terminate(Duration::from_secs(20));
}
